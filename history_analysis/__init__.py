"""PySpark analysis of a history: history.jsonl -> anomaly tables.

In: the path of a history file (shared/history-format.md) and a SparkSession.
Out: an `Analysis` (anomalies.py): counts and example witnesses per anomaly
type (shared/anomalies.md), operation statistics and notes; or a
`faultline.models.history.HistoryError` when the file is malformed.

Modules: `session` (the SparkSession), `load` (validated history as
DataFrames), `anomalies` (the anomaly tables). Imported lazily by the
checker, so importing this package does not start Spark.
"""

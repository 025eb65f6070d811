"""Systems under test by the names `faultline run --db` takes: name -> its `DB` class, built as
`cls(spec, remotes, workdir)` on the run's broker and support nodes."""

from .kafka import KafkaDB
from .reference import ReferenceBrokerDB

DBS = {
    "reference": ReferenceBrokerDB,
    "kafka": KafkaDB,
}

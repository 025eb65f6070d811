"""A producer in a process of its own, so that a nemesis can SIGKILL it as it would an application's:
one process, one producer session (its own producer id), ended without a flush.

In: on stdin, one JSON object a line: first the setup `{"config": {librdkafka settings},
"pid_file": path}`, then commands `{"f": "send", "mops": [{"key": k, "value": v}, ...], "timeout":
seconds}`, `{"f": "ping"}`, `{"f": "close"}`. Out: on stdout, one JSON answer a line per command:
for a send `{"reports": [...], "fatal": ...}`: one report per mop, each `{"row": error code or
queue.NOT_QUEUED / NOT_SENT, "offset": n, "detail": text}` or null (no delivery report within the
timeout), and why the producer failed for good during the send (it sends nothing more) or null;
`{}` otherwise; `{"error": text}` for a command it cannot do. The process writes its pid to
`pid_file` once it runs and dies with its parent (`workloads.child`).

Run as `python -m faultline.workloads.producer_child`; `workloads.resend` starts and drives it.
"""

from __future__ import annotations

from confluent_kafka import Producer

from .child import serve
from .queue import produce_all


def handle(producer: Producer, cmd: dict) -> dict:
    f = cmd["f"]
    if f == "send":
        reports, fatal = produce_all(producer, cmd["mops"], cmd["timeout"])
        return {"reports": [None if r is None else r.to_json() for r in reports], "fatal": fatal}
    if f == "close":
        # Whatever is still queued or in flight goes with the process, as with a kill.
        producer.purge()
        producer.flush(0)
        return {}
    return {} if f == "ping" else {"error": f"unknown command {f!r}"}


if __name__ == "__main__":
    serve(lambda setup: Producer(setup["config"]), handle)

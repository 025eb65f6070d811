"""A producer in a process of its own, so that a nemesis can SIGKILL it as it would an application's:
one process, one producer session (its own producer id), ended without a flush.

In: on stdin, one JSON object a line: first the setup `{"config": {librdkafka settings},
"pid_file": path}`, then commands `{"f": "send", "mops": [{"key": k, "value": v}, ...], "timeout":
seconds}`, `{"f": "ping"}`, `{"f": "close"}`. Out: on stdout, one JSON answer a line per command:
for a send `{"reports": [...]}`, one per mop, each `{"row": error code or queue.NOT_QUEUED /
NOT_SENT, "offset": n, "detail": text}` or null (no delivery report within the timeout);
`{}` otherwise; `{"error": text}` for a command it cannot do. The process writes its pid to
`pid_file` once it runs and dies with its parent (`workloads.child`).

Run as `python -m faultline.workloads.producer_child`; `workloads.resend` starts and drives it.
"""

from __future__ import annotations

import json
import sys

from confluent_kafka import Producer

from .child import become_child
from .queue import produce_all


def main() -> None:
    out = sys.stdout
    setup = json.loads(sys.stdin.readline())
    become_child(setup.get("pid_file"))
    producer = Producer(setup["config"])

    def answer(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    for line in sys.stdin:
        cmd = json.loads(line)
        f = cmd["f"]
        if f == "send":
            reports = produce_all(producer, cmd["mops"], cmd["timeout"])
            answer({"reports": [None if r is None else {"row": r.row, "offset": r.offset, "detail": r.detail}
                                for r in reports]})
        elif f == "ping":
            answer({})
        elif f == "close":
            # Whatever is still queued or in flight goes with the process, as with a kill.
            producer.purge()
            producer.flush(0)
            answer({})
            return
        else:
            answer({"error": f"unknown command {f!r}"})


if __name__ == "__main__":
    main()

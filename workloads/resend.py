"""The resend workload: Jepsen's queue, with each process's producer in a process of its own and an
application that sends again what it never learned the fate of.

In: the test spec and the folder for the producers' pid files. Out: a `Workload` whose clients
(`ResendClient`) send through a child process (`workloads.producer_child`: one process, one producer
session, with its own producer id), so that the kill-producer nemesis can SIGKILL it mid-send; polls,
assigns and the final reads stay in the harness. A send whose producer died before it began did
nothing; one whose producer died during it may have written any of its values (`info`); either way
the process ends, and its worker's next process, a new producer session, first sends the values not
acknowledged again (`QueueGenerator.resend`), as an application that retries does. With idempotence
on, a duplicate can then only span two sessions: a witness's `sends` name them.
"""

from __future__ import annotations

from pathlib import Path

from .child import Child, ChildGone
from .core import Workload
from .queue import Op, QueueClient, QueueGenerator, Report, queue_workload, send_completion

SEND_WAIT = 10  # seconds beyond the send's own timeout for the child to answer


class ResendClient(QueueClient):
    """One process's producer (a child process: one producer session) and in-harness consumer."""

    def __init__(self, *args, process: int, clients_dir: Path | None, **kw):
        super().__init__(*args, **kw)
        self.session = Child("faultline.workloads.producer_child",
                             None if clients_dir is None else Path(clients_dir) / f"producer-{process}.pid")

    def _open_producer(self) -> None:
        # The process's producer is the child's session; the harness opens none of its own.
        self.session.start({"config": {"bootstrap.servers": self.bootstrap, **self.producer_settings}})

    def close(self) -> None:
        self.session.close()
        super().close()

    def _send(self, op: Op) -> Op:
        mops = op["mops"]
        unknown = [dict(m, offset=None) for m in mops]
        if not self.session.alive:
            return {"type": "info", "mops": unknown,
                    "error": "the producer's process was dead (killed) before this send, which sent nothing: its "
                             "process ends"}
        try:
            answer = self.session.ask({"f": "send", "mops": mops, "timeout": self.send_timeout},
                                      self.send_timeout + SEND_WAIT)
        except ChildGone as exc:
            return {"type": "info", "mops": unknown, "error": f"{exc} during the send: any of its values may have "
                                                             f"been written; its process ends"}
        reports = [None if r is None else Report.from_json(r) for r in answer["reports"]]
        return send_completion(mops, reports, self.retries, answer.get("fatal"))


def workload(spec, clients_dir: Path | None = None) -> Workload:
    """The resend workload of a test spec."""
    def client(bootstrap: str, process: int, group_id: str) -> ResendClient:
        return ResendClient(bootstrap, spec.producer, spec.consumer, group_id=group_id, process=process,
                            clients_dir=clients_dir)

    def main(thread: int) -> QueueGenerator:
        return QueueGenerator.start(spec.seed, thread, spec.concurrency, spec.keys, spec.max_sends_per_op, spec.rate,
                                    resend=True)

    return queue_workload(spec, "resend", client, main)

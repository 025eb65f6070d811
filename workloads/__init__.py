"""Workloads by the names `faultline run --workload` takes: name -> (spec, clients_dir -> `Workload`).

`clients_dir`: a folder of the run where a workload whose clients run in processes of their own
(the consume workloads' group members, the resend workload's producers) leaves their pid files, for
the kill-consumer and kill-producer nemeses.
"""

from functools import partial

from . import consume, queue, resend, txn

WORKLOADS = {
    "queue": queue.workload,
    "txn": txn.workload,
    "subscribe": queue.subscribe_workload,
    "txn-subscribe": txn.subscribe_workload,
    "consume-auto": partial(consume.workload, name="consume-auto"),
    "consume-after": partial(consume.workload, name="consume-after"),
    "consume-before": partial(consume.workload, name="consume-before"),
    "resend": resend.workload,
}

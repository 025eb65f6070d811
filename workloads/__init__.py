"""Workloads by the names `faultline run --workload` takes: name -> (spec -> `Workload`)."""

from . import queue, txn

WORKLOADS = {
    "queue": queue.workload,
    "txn": txn.workload,
    "subscribe": queue.subscribe_workload,
    "txn-subscribe": txn.subscribe_workload,
}

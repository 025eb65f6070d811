"""Workloads by the names `faultline run --workload` takes: name -> (spec -> `Workload`)."""

from . import queue

WORKLOADS = {
    "queue": queue.workload,
}

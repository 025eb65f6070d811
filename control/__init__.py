"""Nodes and how to reach them.

In: node names and a backend (only the local network-namespace backend
exists so far). Out: one `Remote` per node (run commands, spawn/kill/stop/
pause/resume daemons, copy files), the cluster's teardown, the cleanup of
clusters left by crashed harnesses, and `wait_until` for polling with a
deadline.
"""

from .cleanup import Leftovers, cleanup, find_leftovers
from .local_cluster import LocalCluster
from .namespace_remote import NamespaceRemote
from .remote import AlreadyRunning, CommandFailed, CommandTimeout, NotRunning, Remote, RemoteError
from .wait import wait_until

__all__ = [
    "AlreadyRunning", "CommandFailed", "CommandTimeout", "Leftovers", "LocalCluster", "NamespaceRemote",
    "NotRunning", "Remote", "RemoteError", "cleanup", "find_leftovers", "wait_until",
]

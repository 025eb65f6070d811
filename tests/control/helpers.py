"""Small programs the control tests run on nodes, and checks of the host's state.

In: tags of the clusters a test made. Out: the names of our namespaces and
links still on the host, and whether a pid is gone.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from faultline.control import forward
from faultline.control.iproute import link_kind, list_links, list_namespaces
from faultline.control.names import BRIDGE_RE, NAMESPACE_RE, VETH_RE
from faultline.control.processes import process_state

PY = sys.executable

# Answers every connection with its node name and the peer's address, so a
# client learns it reached the right node and from which address it came.
SERVER = r"""
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
while True:
    conn, peer = server.accept()
    conn.sendall(f"{sys.argv[3]} {peer[0]}\n".encode())
    conn.close()
"""

CLIENT = r"""
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as s:
    print(s.makefile().readline().strip())
"""

# Appends one byte per tick: the file's size is how far it got.
COUNTER = r"""
import sys, time
with open(sys.argv[1], "a") as f:
    while True:
        f.write("x")
        f.flush()
        time.sleep(0.005)
"""

SLEEPER = "import time; time.sleep(1000)"

# Installs its SIGTERM handler, then says so; exits 0 on SIGTERM.
GRACEFUL = r"""
import signal, sys, time
def term(signum, frame):
    print("got SIGTERM", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("ready", flush=True)
while True:
    time.sleep(0.1)
"""

STUBBORN = r"""
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
while True:
    time.sleep(0.1)
"""

# Leaves a grandchild in a new session of its own, out of reach of killpg.
ESCAPER = r"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    open(sys.argv[1], "w").write(str(os.getpid()))
    time.sleep(1000)
    os._exit(0)
time.sleep(1000)
"""

USED_TAGS: set[str] = set()


def new_tag() -> str:
    tag = "t" + secrets.token_hex(3)
    USED_TAGS.add(tag)
    return tag


def ours_on_host(tags: set[str]) -> list[str]:
    """Namespaces, links and FORWARD rules on this machine that belong to any of `tags`."""
    found = []
    for name in list_namespaces():
        match = NAMESPACE_RE.match(name)
        if match and match[1] in tags:
            found.append(f"namespace {name}")
    for link in list_links():
        name = link.get("ifname", "")
        match = BRIDGE_RE.match(name) or VETH_RE.match(name)
        if match and match[1] in tags:
            found.append(f"{link_kind(link)} {name}")
    found += [f"FORWARD rule {rule}" for tag, rules in forward.rules().items() if tag in tags for rule in rules]
    return found


def gone(pid: int) -> bool:
    """No such process, or only its zombie (this machine's init does not reap orphans)."""
    return process_state(pid) in (None, "Z", "X")


def size(path: Path) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0

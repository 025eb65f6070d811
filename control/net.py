"""The `Net`: cut and heal links between nodes with iptables inside each node.

In: the nodes' `Remote`s (each with an `address` and `run`), and grudges: for
each node, the nodes whose packets it drops. Out: iptables DROP rules in a
chain of our own, `FAULTLINE`, hooked into INPUT and OUTPUT of each node's
namespace, so that a grudge stops traffic both ways (a node drops what comes
from a peer and what it sends to one); `heal()` flushes exactly that chain on
every node, going on after a node fails, says per node whether it worked, and
leaves every other rule alone. `rules()` lists what is in place, for tests
and for the nemesis's record.

Traffic between the harness and the nodes (clients, the harness's own
ZooKeeper reads) is not touched: only node-to-node addresses are dropped, as
in Jepsen, where clients run outside the partitioned network.
"""

from __future__ import annotations

import logging
import shutil
import threading

log = logging.getLogger("faultline.net")

CHAIN = "FAULTLINE"
HEALED = "healed"


class NetError(RuntimeError):
    pass


def require_iptables() -> None:
    if shutil.which("iptables") is None:
        raise NetError("iptables is not installed: network partitions need it. Run scripts/setup, "
                       "or apt-get install iptables")


class Net:
    def __init__(self, remotes: dict):
        require_iptables()
        self.remotes = remotes
        self.addresses = {node: r.address for node, r in remotes.items()}
        self._prepared: set[str] = set()
        self._lock = threading.Lock()

    def _iptables(self, node: str, *args: str, check: bool = True):
        # -w: wait for the xtables lock rather than fail when another rule change is in flight.
        return self.remotes[node].run(["iptables", "-w", "5", *args], check=check, timeout=30)

    def _prepare(self, node: str) -> None:
        if node in self._prepared:
            return
        if self._iptables(node, "-n", "-L", CHAIN, check=False).returncode != 0:
            self._iptables(node, "-N", CHAIN)
        for hook in ("INPUT", "OUTPUT"):
            if self._iptables(node, "-C", hook, "-j", CHAIN, check=False).returncode != 0:
                self._iptables(node, "-I", hook, "1", "-j", CHAIN)
        self._prepared.add(node)

    def drop(self, grudge: dict[str, set[str] | list[str]]) -> dict[str, list[str]]:
        """Apply a grudge: node -> peers whose traffic it drops (both directions on that node).
        Returns the grudge as applied, sorted, for the history."""
        applied: dict[str, list[str]] = {}
        with self._lock:
            for node, peers in sorted(grudge.items()):
                peers = sorted(set(peers) - {node})
                if not peers:
                    continue
                self._prepare(node)
                for peer in peers:
                    addr = self.addresses[peer]
                    self._iptables(node, "-A", CHAIN, "-s", addr, "-j", "DROP")
                    self._iptables(node, "-A", CHAIN, "-d", addr, "-j", "DROP")
                applied[node] = peers
        log.info("partitioned: %s", applied)
        return applied

    def heal(self) -> dict[str, str]:
        """Remove every rule this Net added, node by node, going on after a node fails. Returns each
        node's outcome: "healed" (its chain flushed), or the error naming the node (its rules may
        still be in place: the next heal tries it again)."""
        outcomes: dict[str, str] = {}
        with self._lock:
            for node in sorted(self._prepared):
                try:
                    self._iptables(node, "-F", CHAIN)
                    outcomes[node] = HEALED
                except Exception as exc:  # noqa: BLE001 - recorded; the other nodes are still healed
                    log.warning("healing the network of %s failed: %s", node, exc)
                    outcomes[node] = f"{node}: {type(exc).__name__}: {exc}"
        return outcomes

    def rules(self, node: str) -> list[str]:
        """The DROP rules in our chain on `node`, as `iptables -S` prints them."""
        out = self._iptables(node, "-S", CHAIN, check=False)
        if out.returncode != 0:
            return []
        return [line for line in out.stdout.splitlines() if line.startswith("-A ")]

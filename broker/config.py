"""Broker settings, by Kafka's own names and meanings.

In: a `server.properties` file (Java properties syntax), `key=value` overrides
and the command line's node id, listener and data directory.
Out: a `BrokerConfig` whose attributes are the typed values, or a
`ConfigError` naming the setting, what is wrong with it and how to fix it.

Only settings the broker really implements are accepted: a setting Kafka has
but this broker would ignore is refused, so that a user never believes a
mechanism is on when it is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

LONG_MAX = 2**63 - 1


class ConfigError(ValueError):
    """A setting is unknown or has a value the broker cannot use."""


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise ValueError("expected true or false")


def _int_at_least(low: int, high: int = LONG_MAX) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text.strip())
        if not low <= value <= high:
            raise ValueError(f"expected an integer from {low} to {high}")
        return value

    return parse


def _one_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip()
        if value not in choices:
            raise ValueError("expected one of " + ", ".join(choices))
        return value

    return parse


def _optional_long(text: str) -> int | None:
    text = text.strip()
    if text in ("", "null"):
        return None
    return _int_at_least(1)(text)


@dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in [
        Setting("auto.create.topics.enable", _bool, True,
                "create a topic when a client asks for or produces to one that does not exist"),
        Setting("num.partitions", _int_at_least(1, 100_000), 1,
                "partitions of an automatically created topic"),
        Setting("default.replication.factor", _int_at_least(1, 1000), 1,
                "replicas of an automatically created topic, or of one created with replication factor -1"),
        Setting("min.insync.replicas", _int_at_least(1), 1,
                "acks=all produce is refused with NOT_ENOUGH_REPLICAS when fewer replicas are in sync "
                "(capped at the partition's replication factor, as Kafka caps it)"),
        Setting("log.segment.bytes", _int_at_least(14, 2**31 - 1), 1073741824,
                "a partition's active segment is rolled when the next batch would make it larger"),
        Setting("log.index.interval.bytes", _int_at_least(0, 2**31 - 1), 4096,
                "bytes of log between two entries of a segment's offset index"),
        Setting("log.flush.interval.messages", _int_at_least(1), LONG_MAX,
                "fsync a partition once this many messages were appended since its last fsync"),
        Setting("log.flush.interval.ms", _optional_long, None,
                "fsync a partition this long after its last fsync, when the flusher next looks "
                "(null: log.flush.scheduler.interval.ms); nothing happens by time unless "
                "log.flush.scheduler.interval.ms is set too, as in Kafka"),
        Setting("log.flush.scheduler.interval.ms", _int_at_least(1), LONG_MAX,
                "how often the flusher looks at log.flush.interval.ms (default: never)"),
        Setting("message.max.bytes", _int_at_least(0, 2**31 - 1), 1048588,
                "largest record batch a producer may send"),
        Setting("socket.request.max.bytes", _int_at_least(1, 2**31 - 1), 104857600,
                "largest request frame; a larger one closes the connection"),
        Setting("log.message.timestamp.type", _one_of("CreateTime", "LogAppendTime"), "CreateTime",
                "which time a record batch carries: the producer's or the broker's at append"),
        Setting("advertised.listeners", str, None,
                "HOST:PORT clients are told to connect to (default: the listener)"),
        Setting("zookeeper.connect", str, None,
                "HOST:PORT[,HOST:PORT...][/chroot] of ZooKeeper: join a replicated cluster "
                "(unset: one standalone broker that leads every partition)"),
        Setting("zookeeper.session.timeout.ms", _int_at_least(1000, 600_000), 18000,
                "ZooKeeper session timeout: how long after a broker dies the cluster notices"),
        Setting("replica.lag.time.max.ms", _int_at_least(1), 30000,
                "a follower that has not caught up with the leader for this long leaves the ISR"),
        Setting("replica.fetch.wait.max.ms", _int_at_least(0, 60_000), 500,
                "how long a follower's fetch waits at the leader for new data"),
        Setting("replica.fetch.min.bytes", _int_at_least(1, 2**31 - 1), 1,
                "bytes a follower's fetch waits for at the leader (up to replica.fetch.wait.max.ms) "
                "before it is answered; larger values batch replication and widen the window acks=1 "
                "writes live on the leader alone"),
        Setting("replica.fetch.max.bytes", _int_at_least(1, 2**31 - 1), 1048576,
                "bytes a follower asks per partition and fetch"),
        Setting("replica.fetch.backoff.ms", _int_at_least(0, 600_000), 1000,
                "pause of a follower after a failed fetch before it tries again"),
        Setting("replica.high.watermark.checkpoint.interval.ms", _int_at_least(1), 5000,
                "how often each replica writes its high watermarks to replication-offset-checkpoint"),
        Setting("unclean.leader.election.enable", _bool, False,
                "when no in-sync replica is alive, elect any live replica (may lose acknowledged data) "
                "instead of waiting"),
        Setting("controlled.shutdown.enable", _bool, True,
                "on SIGTERM, ask the controller to move leadership away before stopping"),
        Setting("controlled.shutdown.max.retries", _int_at_least(0, 1000), 3,
                "attempts at moving leadership away before a shutdown gives up and stops anyway"),
        Setting("controlled.shutdown.retry.backoff.ms", _int_at_least(0, 600_000), 5000,
                "how long one controlled shutdown attempt waits for leadership to move"),
        Setting("faultline.truncation", _one_of("leader-epoch", "leader-epoch-once", "high-watermark"),
                "leader-epoch",
                "UNSAFE when not leader-epoch. How a replica that becomes a follower truncates: "
                "leader-epoch, as Kafka 3.9 (KIP-101 with KIP-279: it asks the leader where its epochs "
                "end and asks again until the logs agree); leader-epoch-once, as Kafka 0.11 to 1.1 "
                "(KIP-101 before KIP-279: one question, so repeated fast leader changes can leave a "
                "diverged log); high-watermark, as before Kafka 0.11 (to its own high watermark, which "
                "can lose or diverge data)"),
        Setting("faultline.high.watermark.below.min.isr", _bool, False,
                "UNSAFE when true. Let the high watermark advance while the ISR is smaller than "
                "min.insync.replicas, as Kafka did before 3.7 (KAFKA-15583): consumers then read "
                "acks=1 data that only the leader holds"),
        Setting("producer.id.block.size", _int_at_least(1, 1_000_000), 1000,
                "producer ids reserved on disk at a time, so a restart never hands out one twice"),
    ]
}

# Kafka's names for the values the command line gives, and the flag that gives each.
COMMAND_LINE_SETTINGS = {"broker.id": "--node-id", "node.id": "--node-id", "listeners": "--listen",
                         "log.dirs": "--data-dir", "log.dir": "--data-dir"}


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    """Java properties escapes: \\t \\n \\r \\f, \\uXXXX, and \\x for any other x."""

    def one(m: re.Match) -> str:
        c = m.group(1)
        if c.startswith("u"):
            return chr(int(c[1:], 16))
        return _ESCAPES.get(c, c)

    return re.sub(r"\\(u[0-9a-fA-F]{4}|.)", one, text)


def parse_properties(text: str, source: str) -> dict[str, tuple[str, str]]:
    """Parse Java properties text. Returns {key: (value, "file:line")}."""
    out: dict[str, tuple[str, str]] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        start = i
        line = lines[i].lstrip()
        i += 1
        if not line or line[0] in "#!":
            continue
        # A trailing odd number of backslashes continues the line.
        while re.search(r"(?<!\\)(\\\\)*\\$", line) and i < len(lines):
            line = line[:-1] + lines[i].lstrip()
            i += 1
        match = re.match(r"((?:\\.|[^=:\s])+)\s*[=:\s]\s*(.*)$", line)
        if match:
            key, value = match.group(1), match.group(2)
        else:
            key, value = line, ""
        out[_unescape(key)] = (_unescape(value.rstrip()), f"{source}:{start + 1}")
    return out


@dataclass
class BrokerConfig:
    node_id: int
    host: str
    port: int
    data_dir: Path
    values: dict[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    @property
    def advertised(self) -> tuple[str, int]:
        adv = self.values.get("advertised.listeners")
        if not adv:
            return self.host, self.port
        return parse_hostport(adv, "advertised.listeners")


def parse_hostport(text: str, where: str) -> tuple[str, int]:
    text = text.strip()
    if "://" in text:
        text = text.split("://", 1)[1]
    if "," in text:
        raise ConfigError(f"{where}: only one listener is supported, got {text!r}; give one HOST:PORT")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{where}: {text!r} is not HOST:PORT; write it like 127.0.0.1:9092")
    return host.strip("[]") or "0.0.0.0", int(port)


def load_config(
    node_id: int,
    listen: str,
    data_dir: str | Path,
    config_file: str | Path | None = None,
    overrides: list[str] | None = None,
) -> BrokerConfig:
    """Merge defaults, the properties file and `key=value` overrides, in that order."""
    raw: dict[str, tuple[str, str]] = {}
    if config_file is not None:
        path = Path(config_file)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read the config file {path}: {exc.strerror}") from None
        raw.update(parse_properties(text, str(path)))
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key=value, for example --set num.partitions=3")
        raw[key.strip()] = (value.strip(), "--set")

    values = {name: s.default for name, s in SETTINGS.items()}
    for key, (value, where) in raw.items():
        if key in COMMAND_LINE_SETTINGS:
            raise ConfigError(
                f"{where}: {key} is given on the command line here ({COMMAND_LINE_SETTINGS[key]}); "
                f"remove it from the settings"
            )
        setting = SETTINGS.get(key)
        if setting is None:
            raise ConfigError(
                f"{where}: unknown setting {key!r}: the faultline broker does not implement it, "
                f"so it would have no effect. Remove it, or see `faultline broker --list-settings`"
            )
        try:
            values[key] = setting.parse(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: {key}={value!r} is invalid: {exc}") from None
    if values["advertised.listeners"]:
        parse_hostport(values["advertised.listeners"], "advertised.listeners")
    host, port = parse_hostport(listen, "--listen")
    if node_id < 0:
        raise ConfigError(f"--node-id {node_id}: a node id is 0 or more")
    return BrokerConfig(node_id=node_id, host=host, port=port, data_dir=Path(data_dir), values=values)


def describe_settings() -> str:
    rows = [f"{s.name} (default {s.default!r})\n    {s.doc}" for s in SETTINGS.values()]
    return "\n".join(rows)

"""Guarantee models: which anomaly types a run may show and which it forbids.

In: the run's settings (producer acks and idempotence, consumer mode), or a
model's name. Out: a `Model` with the set of anomaly types that make the run
invalid. The names of the types are those of shared/anomalies.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

ALL_TYPES = (
    "lost-write", "unseen", "duplicate", "inconsistent-offsets", "unexpected", "uncommitted-read",
    "G1a", "precommitted-read", "poll-skip", "nonmonotonic-poll", "nonmonotonic-send",
    "int-poll-skip", "int-nonmonotonic-poll", "int-send-skip", "int-nonmonotonic-send", "G0", "G1c",
    "G0-process", "G1c-process", "G0-realtime", "G1c-realtime",
)

# Kafka promises no write isolation between transactions or within a send.
NEVER_BAD = frozenset({"G0", "int-send-skip"})
# A rebalance under subscribe moves a consumer: skips and rewinds are expected.
SUBSCRIBE_ALLOWED = frozenset({"poll-skip", "nonmonotonic-poll"})
# Retries without idempotence may write a value twice or reorder a producer's batches, and a
# send reported failed (its last attempt refused) may have been appended by an earlier attempt.
RETRY_ALLOWED = frozenset({"duplicate", "nonmonotonic-send", "int-nonmonotonic-send", "G1a"})
# Without acks=all an acknowledged write can vanish, and its offset be given to a later write, so
# a log's order need not follow the order in which writes were acknowledged.
LOSS_ALLOWED = frozenset({"lost-write", "unseen", "G0-process", "G1c-process", "G0-realtime", "G1c-realtime"})


@dataclass(frozen=True)
class Model:
    name: str
    allowed: frozenset[str]
    description: str

    @property
    def forbidden(self) -> frozenset[str]:
        return frozenset(ALL_TYPES) - self.allowed

    def with_subscribe(self) -> "Model":
        return Model(self.name, self.allowed | SUBSCRIBE_ALLOWED, self.description + "; consumers subscribe")


MODELS: dict[str, Model] = {
    m.name: m
    for m in [
        Model("exactly-once", NEVER_BAD,
              "acks=all with idempotence: nothing acknowledged is lost, nothing is written twice, order holds"),
        Model("at-least-once", NEVER_BAD | RETRY_ALLOWED,
              "acks=all without idempotence: nothing acknowledged is lost; retries may duplicate or reorder"),
        Model("at-most-once", NEVER_BAD | LOSS_ALLOWED,
              "acks=0/1 with no retries: writes may be lost, never duplicated"),
        Model("best-effort", NEVER_BAD | RETRY_ALLOWED | LOSS_ALLOWED,
              "acks=0/1 with retries: writes may be lost or duplicated; reads must still be consistent"),
    ]
}
STRICTEST = "exactly-once"


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def model_for_settings(producer: Mapping[str, Any], consumer_mode: str = "assign") -> Model:
    """The model Kafka's documentation promises for these producer settings."""
    acks = str(producer.get("acks", "all")).strip().lower()
    idempotent = _truthy(producer.get("enable.idempotence", False))  # librdkafka's default
    retries = int(producer.get("retries", 2147483647))
    if acks in ("all", "-1"):
        model = MODELS["exactly-once" if idempotent else "at-least-once"]
    else:
        model = MODELS["at-most-once" if retries == 0 else "best-effort"]
    return model.with_subscribe() if consumer_mode == "subscribe" else model


def model_named(name: str) -> Model:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}") from None

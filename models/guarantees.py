"""Guarantee models: which promises a run claims, and so which anomaly types make it invalid.

In: the run's settings (producer, consumer mode and settings, broker settings, the nemesis list), or a
model's name. Out: a `Model`: for each promise of models/anomaly_types.PROMISES whether the run claims
it and why (which setting gives or withdraws it). A registered type is forbidden when the model claims
every promise it breaks; a type the registry does not know is forbidden under every model (fail
closed).

What Kafka's documentation promises, and which setting withdraws each promise:

- readable-log: always. A consumer reads only what producers wrote.
- no-aborted-reads: a send the client reports failed was certainly not written (the queue client
  reports an ambiguous refusal as info, not fail). Withdrawn when producers use transactions
  (`transactional.id`) and consumers `isolation.level=read_uncommitted`: those read aborted
  transactions' writes.
- durable-commits: a record is committed once every in-sync replica has it; the high watermark marks
  the committed prefix and consumers read only below it; "a committed message will not be lost, as
  long as there is at least one in sync replica alive". Nothing the producer sets changes this: acks
  decides when a send is acknowledged, not when a record is committed. (min.insync.replicas refuses
  acks=all sends while the ISR is small and, since Kafka 3.7, holds the high watermark back then;
  before, and with `faultline.high.watermark.below.min.isr=true`, the ISR could be the leader alone
  and its log the committed one. Either way no out-of-sync replica is elected cleanly.)
  So a read that the cluster later discards (uncommitted-read), readers that disagree on an offset
  (inconsistent-offsets), and a consumer thrown off its position by a log cut below it are bugs,
  except where the settings let committed records go: `unclean.leader.election.enable=true` (an
  out-of-sync replica becomes leader and the others truncate to its log),
  `faultline.truncation=high-watermark` (the pre-KIP-101 truncation, which can lose or diverge
  committed records) or `=leader-epoch-once` (KIP-101 without KIP-279's repeated question), and a power-loss nemesis without `log.flush.interval.messages=1` (power loss
  drops what was not fsynced, committed or not, from every replica it hits).
- consumer-order: a consumer under assign reads on from its position. Withdrawn under subscribe: a
  rebalance moves it.
- no-loss: an acknowledged write stays. Needs acks=all (with acks=1 the leader acknowledges before
  the followers copy, and a new leader may lack the write; acks=0 acknowledges nothing), what
  durable-commits needs, and min.insync.replicas >= 2 when the run has faults: with
  min.insync.replicas=1 acks=all waits only for the in-sync replicas, which may be the leader alone,
  and "these writes could be lost if the remaining replica also fails" (Kafka's documentation). A
  run without faults fails no replica.
- no-duplicates: idempotence with acks=all (the broker drops a retried batch it already wrote and
  keeps a producer's batches in order), or retries=0 (each batch is sent once). Otherwise a retried
  batch may be written twice, or land after a later one.
- atomic-transactions: an operation that sends and polls is atomic and reads only committed writes
  when it is a transaction (`transactional.id`) read with `isolation.level=read_committed`;
  otherwise its sends and polls are separate requests, and a cycle of reads between two such
  operations (each sends, then polls the other's write) is a legal interleaving.
- write-isolation: never promised by Kafka (other producers' writes land between and around a
  transaction's); claimed only by a model name that asks for it, e.g. `exactly-once+write-isolation`.
- no-lost-consumption and no-duplicate-consumption: what a consumer group's application gets from
  when it commits its offsets (the workload's `commit` mode): committing after processing loses
  nothing but may process again what a killed member had processed and not committed; committing
  before processing never processes twice but loses what a killed member had committed and not
  processed; auto-commit (in the background, at any point) promises neither. A run whose consumers
  commit no offsets claims both: it has nothing to judge.

The four model names are the base: exactly-once (no-loss and no-duplicates, and of consumption
no-lost-consumption and no-duplicate-consumption), at-least-once (no-loss, no-lost-consumption),
at-most-once (no-duplicates, no-duplicate-consumption), best-effort (neither); each also claims readable-log,
no-aborted-reads, durable-commits, consumer-order and atomic-transactions (the strictest reading of
a history alone, whose mixed operations are transactions). A model derived from settings takes its
base name from the promises it claims, and says in parentheses which broker setting or fault
withdrew what, e.g. "at-most-once (min.insync.replicas=1 with faults kill-leader: acknowledged writes
may be lost)". How consumers read (assign or subscribe) is a fact of the run and applies to named
models too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .anomaly_types import (ATOMIC_TRANSACTIONS, CONSUMER_ORDER, DURABLE_COMMITS, NO_ABORTED_READS,
                            NO_DUPLICATE_CONSUMPTION, NO_DUPLICATES, NO_LOSS, NO_LOST_CONSUMPTION, PROMISES,
                            READABLE_LOG, REGISTRY, WRITE_ISOLATION, lookup)

LONG_MAX = 2**63 - 1
# Nemesis kinds that cannot make a replica fail: every other kind (kill, pause, power loss, partition,
# restarts, and any kind this list does not know) counts as one that can.
HARMLESS_FAULTS = frozenset({"clock", "kill-consumer", "kill-producer"})
BASE_NAMES = {(True, True): "exactly-once", (True, False): "at-least-once",
              (False, True): "at-most-once", (False, False): "best-effort"}
DESCRIPTIONS = {
    "exactly-once": "nothing acknowledged is lost, nothing is written twice, order holds",
    "at-least-once": "nothing acknowledged is lost; retries may duplicate or reorder",
    "at-most-once": "writes may be lost, never duplicated",
    "best-effort": "writes may be lost or duplicated; reads must still be consistent",
}
STRICTEST = "exactly-once"
# What a broker setting or a fault that withdraws these promises lets go, for the model's name (only
# these promises are withdrawn by broker settings or faults).
LOSES = {NO_LOSS: "acknowledged writes", DURABLE_COMMITS: "committed records"}


@dataclass(frozen=True)
class Claim:
    """Whether the run claims `promise`, and why: each reason names the setting it comes from."""
    promise: str
    claimed: bool
    reasons: tuple[str, ...]
    # Reasons (a subset) that come from a broker setting or a fault, which the model's name mentions.
    broker_reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class Model:
    name: str
    claims: tuple[Claim, ...]
    description: str

    @property
    def promises(self) -> frozenset[str]:
        return frozenset(c.promise for c in self.claims if c.claimed)

    def claim(self, promise: str) -> Claim:
        return next(c for c in self.claims if c.promise == promise)

    def forbids(self, anomaly_type: str) -> bool:
        """Whether finding `anomaly_type` makes the run invalid: it breaks promises that the model all
        claims, or the registry does not know it (fail closed)."""
        t = lookup(anomaly_type)
        return t is None or (bool(t.breaks) and t.breaks <= self.promises)

    @property
    def forbidden(self) -> frozenset[str]:
        return frozenset(t.name for t in REGISTRY if self.forbids(t.name))

    @property
    def allowed(self) -> frozenset[str]:
        return frozenset(t.name for t in REGISTRY if not self.forbids(t.name))

    def why(self, anomaly_type: str) -> str:
        """Why `anomaly_type` is forbidden or allowed under this model, naming promises and settings."""
        t = lookup(anomaly_type)
        if t is None:
            return "not in the anomaly registry: nobody has judged it, so it is bad under every model"
        if not t.breaks:
            return t.never_bad
        needed = sorted(t.breaks)
        rules = (f"only {' and '.join(needed)} together rule it out" if len(needed) > 1
                 else f"only {needed[0]} rules it out")

        def because(promises: list[str]) -> str:
            if len(promises) == 1:
                return "because " + "; ".join(self.claim(promises[0]).reasons)
            return "; ".join(f"{p} because {'; '.join(self.claim(p).reasons)}" for p in promises)

        missing = [p for p in needed if p not in self.promises]
        if not missing:
            return f"{rules}, and the run claims {'them' if len(needed) > 1 else 'it'} ({because(needed)})"
        return f"{rules}, and the run does not claim {' nor '.join(missing)} ({because(missing)})"

    def explain(self) -> str:
        """The model as text: its promises, then every registered type, forbidden or allowed, and why."""
        lines = [f"model {self.name}: {self.description}", "promises:"]
        for c in self.claims:
            lines.append(f"  {'claimed    ' if c.claimed else 'not claimed'} {c.promise}: {PROMISES[c.promise]}")
            lines.extend(f"      because {r}" for r in c.reasons)
        lines.append("anomaly types:")
        for t in REGISTRY:
            lines.append(f"  {'FORBIDDEN' if self.forbids(t.name) else 'allowed  '} {t.name}: {self.why(t.name)}")
        lines.append("  FORBIDDEN any type not listed above (fail closed: nobody has judged it)")
        return "\n".join(lines)


def for_history(model: Model, stats: Mapping[str, Any]) -> Model:
    """`model` with what the history itself shows, whatever the settings or the model's name say
    (an engine's stats: `by_f`, `mixed`):
    - processes that subscribe: consumer-order is not claimed (a rebalance moves a consumer);
    - no operation both sends and polls: atomic-transactions is claimed, since an operation that
      only sends or only polls is atomic as far as any dependency can tell (a cycle of reads and
      orders needs an operation that read between its own sends, or sent between its own reads)."""
    by_f = stats.get("by_f") or {}
    claims = list(model.claims)
    changed = False
    for i, c in enumerate(claims):
        if c.promise == CONSUMER_ORDER and c.claimed and by_f.get("subscribe", {}).get("invoked"):
            claims[i] = Claim(CONSUMER_ORDER, False, ("the history's processes subscribe: a rebalance moves a "
                                                      "consumer's position",))
            changed = True
        elif c.promise == ATOMIC_TRANSACTIONS and not c.claimed and stats.get("mixed", 0) == 0:
            claims[i] = Claim(ATOMIC_TRANSACTIONS, True, ("no operation of the history both sends and polls, so "
                                                          "each is atomic as far as its dependencies can show",))
            changed = True
    if not changed:
        return model
    adjusted = Model(model.name, tuple(claims), model.description)
    if model.claim(CONSUMER_ORDER).claimed and not adjusted.claim(CONSUMER_ORDER).claimed:
        adjusted = Model(model.name, adjusted.claims, model.description + "; consumers subscribe")
    return adjusted


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def _int(settings: Mapping[str, Any], name: str, default: int) -> int:
    value = settings.get(name)
    if value is None or str(value).strip() == "":
        return default
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"setting {name}={value!r} is not a whole number") from None


def _claim(promise: str, withdrawn: list[tuple[str, bool]], given: str) -> Claim:
    """`withdrawn`: (reason, whether a broker setting or fault gives it); claimed when empty."""
    if withdrawn:
        return Claim(promise, False, tuple(r for r, _ in withdrawn), tuple(r for r, broker in withdrawn if broker))
    return Claim(promise, True, (given,))


def _consumer_order(consumer_mode: str) -> Claim:
    if consumer_mode == "subscribe":
        return Claim(CONSUMER_ORDER, False, ("consumer_mode=subscribe: a rebalance moves a consumer's position",))
    return Claim(CONSUMER_ORDER, True, (f"consumer_mode={consumer_mode}: each consumer owns its keys and reads on "
                                        f"from its position",))


COMMIT_MODES = ("auto", "after", "before")


def _consumption(commit: str | None) -> tuple[Claim, Claim]:
    """The consumption promises for a consumer group that commits `commit` (None: commits nothing)."""
    if commit is None:
        why = "no consumer group commits offsets: nothing to lose or repeat"
        return Claim(NO_LOST_CONSUMPTION, True, (why,)), Claim(NO_DUPLICATE_CONSUMPTION, True, (why,))
    if commit not in COMMIT_MODES:
        raise ValueError(f"commit mode {commit!r}: choose one of {', '.join(COMMIT_MODES)}")
    auto = "enable.auto.commit=true: offsets are committed in the background, at any point of processing"
    lost = (Claim(NO_LOST_CONSUMPTION, True, ("offsets committed after processing: a killed member's successor "
                                              "resumes at or before what it processed",)) if commit == "after"
            else Claim(NO_LOST_CONSUMPTION, False, (auto if commit == "auto" else
                                                    "offsets committed before processing: a member killed between "
                                                    "the two never processes what it committed",)))
    dup = (Claim(NO_DUPLICATE_CONSUMPTION, True, ("offsets committed before processing: a killed member's "
                                                  "successor resumes after what it processed",)) if commit == "before"
           else Claim(NO_DUPLICATE_CONSUMPTION, False, (auto if commit == "auto" else
                                                        "offsets committed after processing: a member killed "
                                                        "between the two has its records processed again",)))
    return lost, dup


def _named_name(name: str) -> str:
    return f"the model named {name}"


def model_named(name: str, consumer_mode: str = "assign") -> Model:
    """A base model by name (exactly-once, at-least-once, at-most-once, best-effort), optionally with
    promises added after a `+` (e.g. exactly-once+write-isolation)."""
    base, *extra = [part.strip() for part in name.split("+")]
    flags = {n: k for k, n in BASE_NAMES.items()}.get(base)
    if flags is None:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(BASE_NAMES.values())}, optionally "
                         f"with +PROMISE (one of {', '.join(PROMISES)})")
    unknown = [p for p in extra if p not in PROMISES]
    if unknown:
        raise ValueError(f"model {name!r}: unknown promise(s) {', '.join(unknown)}; known: {', '.join(PROMISES)}")
    no_loss, no_duplicates = flags
    claimed = {READABLE_LOG, NO_ABORTED_READS, DURABLE_COMMITS, ATOMIC_TRANSACTIONS, *extra}
    claimed |= {NO_LOSS, NO_LOST_CONSUMPTION} if no_loss else set()
    claimed |= {NO_DUPLICATES, NO_DUPLICATE_CONSUMPTION} if no_duplicates else set()
    claims = []
    for promise in PROMISES:
        if promise == CONSUMER_ORDER and CONSUMER_ORDER not in extra:
            claims.append(_consumer_order(consumer_mode))
        elif promise in claimed:
            claims.append(Claim(promise, True, (f"{_named_name(name)} claims it",)))
        else:
            claims.append(Claim(promise, False, (f"{_named_name(name)} does not claim it",)))
    description = DESCRIPTIONS[base] + "".join(f"; claims {p}" for p in extra)
    if consumer_mode == "subscribe":
        description += "; consumers subscribe"
    return Model(name, tuple(claims), description)


def model_for_settings(producer: Mapping[str, Any], consumer_mode: str = "assign",
                       broker_settings: Mapping[str, Any] | None = None, nemesis: Iterable[str] | None = None,
                       consumer: Mapping[str, Any] | None = None, transactions: bool = False,
                       commit: str | None = None) -> Model:
    """The model Kafka's documentation promises for these settings (see the module's docstring);
    `transactions`: the workload runs each operation as a transaction, with a transactional.id of
    its own per process (as a producer setting would say for one); `commit`: when its consumer
    group's application commits offsets (auto, after or before processing; None: it does not)."""
    producer = producer or {}
    broker = broker_settings or {}
    consumer = consumer or {}
    faults = [str(n) for n in (nemesis or [])]
    acks = str(producer.get("acks", "all")).strip().lower()
    acks_all = acks in ("all", "-1")
    idempotent = _truthy(producer.get("enable.idempotence", False))  # librdkafka's default
    retries = _int(producer, "retries", _int(producer, "message.send.max.retries", 2147483647))
    transactional = transactions or bool(str(producer.get("transactional.id") or "").strip())
    isolation = str(consumer.get("isolation.level", "read_committed")).strip()  # librdkafka's default
    unclean = _truthy(broker.get("unclean.leader.election.enable", False))
    truncation = str(broker.get("faultline.truncation", "leader-epoch")).strip()
    min_isr = _int(broker, "min.insync.replicas", 1)
    flush = _int(broker, "log.flush.interval.messages", LONG_MAX)
    power = [n for n in faults if n.startswith("power-loss")]
    failing = [n for n in faults if n not in HARMLESS_FAULTS]

    aborted = []
    if transactional and isolation == "read_uncommitted":
        aborted.append(("transactional.id with isolation.level=read_uncommitted: consumers also read the writes "
                        "of aborted transactions", False))

    commits = []
    if unclean:
        commits.append(("unclean.leader.election.enable=true: an out-of-sync replica may be elected, and the "
                        "others truncate their committed records to its log", True))
    if truncation == "high-watermark":
        commits.append(("faultline.truncation=high-watermark: a follower truncates to its own high watermark "
                        "(before KIP-101), which can lose or diverge committed records", True))
    elif truncation == "leader-epoch-once":
        commits.append(("faultline.truncation=leader-epoch-once: a follower asks the leader where to truncate "
                        "only once (KIP-101 before KIP-279), which repeated fast leader changes can leave "
                        "diverged", True))
    if power and flush > 1:
        setting = "unset" if flush == LONG_MAX else str(flush)
        commits.append((f"{', '.join(power)} with log.flush.interval.messages {setting}: power loss drops what "
                        f"was not fsynced, committed records included, from every replica it hits", True))

    loss = []
    if not acks_all:
        loss.append((f"acks={acks}: " + ("the broker acknowledges nothing" if acks == "0" else
                                         "the leader acknowledges before the followers copy the write, and a "
                                         "new leader may lack it"), False))
    loss += commits
    if acks_all and min_isr < 2 and failing:
        loss.append((f"min.insync.replicas={min_isr} with faults {', '.join(failing)}: acks=all waits only for "
                     f"the in-sync replicas, which may be the leader alone, and such writes are lost if it "
                     f"fails", True))
    if acks_all and min_isr >= 2:
        kept = f"acks=all with min.insync.replicas={min_isr}: every acknowledged write is on {min_isr} replicas or more"
    elif acks_all:
        kept = "acks=all and no faults that could fail the only in-sync replica"
    else:
        kept = ""

    duplicates = []
    if not (retries == 0 or (idempotent and acks_all)):
        why = ("enable.idempotence needs acks=all" if idempotent else "enable.idempotence=false")
        duplicates.append((f"{why} with retries={retries}: a retried batch may be written twice, or land after a "
                           f"later one", False))
    no_dup_given = ("enable.idempotence=true with acks=all: the broker drops a retried batch it already wrote and "
                    "keeps a producer's batches in order" if idempotent and acks_all
                    else "retries=0: each batch is sent once")

    atomic = []
    if not transactional:
        atomic.append(("no transactional.id: an operation's sends and polls are separate requests, not one "
                       "transaction", False))
    elif isolation != "read_committed":
        atomic.append((f"isolation.level={isolation}: a transaction may read writes of transactions still open",
                       False))

    claims = (
        Claim(READABLE_LOG, True, ("always: consumers read only what producers wrote",)),
        _claim(NO_ABORTED_READS, aborted, "a send reported failed was certainly not written" +
               ("; isolation.level=read_committed hides aborted transactions" if transactional else "")),
        _claim(DURABLE_COMMITS, commits, "clean leader election and leader-epoch truncation keep every record "
                                         "below the high watermark"),
        _consumer_order(consumer_mode),
        _claim(NO_LOSS, loss, kept),
        _claim(NO_DUPLICATES, duplicates, no_dup_given),
        _claim(ATOMIC_TRANSACTIONS, atomic, "transactional.id with isolation.level=read_committed"),
        Claim(WRITE_ISOLATION, False, ("Kafka promises no write isolation: other producers' writes land between "
                                       "and around an operation's (ask with a model name, e.g. "
                                       "exactly-once+write-isolation)",)),
        *_consumption(commit),
    )
    model = Model("", claims, "")
    base = BASE_NAMES[(NO_LOSS in model.promises, NO_DUPLICATES in model.promises)]
    # Which broker setting or fault lets what go, in the order first given.
    lets_go: dict[str, list[str]] = {}
    for promise, what in LOSES.items():
        for reason in model.claim(promise).broker_reasons:
            lets_go.setdefault(reason.split(":")[0], []).append(what)
    qualifier = "; ".join(f"{setting}: {' and '.join(what)} may be lost" for setting, what in lets_go.items())
    name = f"{base} ({qualifier})" if qualifier else base
    description = DESCRIPTIONS[base]
    if consumer_mode == "subscribe":
        description += "; consumers subscribe"
    return Model(name, claims, description)

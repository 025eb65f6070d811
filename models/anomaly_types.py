"""The registry of anomaly types: every type the checker can report, once.

In: nothing (data only). Out: `REGISTRY`, one `AnomalyType` per type in
report order (the engines' types, then the cycle search's), and `PROMISES`,
the promises a run may claim. Every other list of types derives from this one:
the engines' `TYPES` (history_analysis/result.py), the cycle search's types
(checker/cycles.py), the explanations (checker/explain.py, which a test holds
to exactly these names) and the models' forbidden sets (models/guarantees.py).
A type that is not registered here is bad under every model: the verdict
fails closed on a type nobody judged.

Each type says which promises it `breaks`: the anomaly cannot happen while
all of them hold, so finding it proves that at least one was broken. A model
forbids a type when it claims every one of them. Most types break a single
promise; a type that a weaker guarantee can also produce names that one too
(an inferred cycle, for example, can come from a lost write whose offset a
later write took, so a run that allows loss allows it as well). A type that
breaks no promise is reported but never bad, and says why in `never_bad`.
"""

from __future__ import annotations

from dataclasses import dataclass

ENGINE = "engine"  # found by the per-history analyses (history_analysis: Spark and plain Python)
CYCLES = "cycles"  # found by the checker's cycle search over the engines' dependencies

# Promise names (see PROMISES for what each says).
READABLE_LOG = "readable-log"
NO_ABORTED_READS = "no-aborted-reads"
DURABLE_COMMITS = "durable-commits"
CONSUMER_ORDER = "consumer-order"
NO_LOSS = "no-loss"
NO_DUPLICATES = "no-duplicates"
ATOMIC_TRANSACTIONS = "atomic-transactions"
WRITE_ISOLATION = "write-isolation"
NO_LOST_CONSUMPTION = "no-lost-consumption"
NO_DUPLICATE_CONSUMPTION = "no-duplicate-consumption"

PROMISES: dict[str, str] = {
    READABLE_LOG: "every value a consumer reads was sent to that key by some operation",
    NO_ABORTED_READS: "a write that certainly failed (a refused send, an aborted transaction) is never read",
    DURABLE_COMMITS: "a committed record (below the high watermark: all that consumers read) is never discarded "
                     "or replaced, so every reader sees one log, in offset order",
    CONSUMER_ORDER: "a consumer that owns a key by assign reads it on from its position: no offset skipped, "
                    "none read again",
    NO_LOSS: "an acknowledged write stays in the log at the offset it was acknowledged at",
    NO_DUPLICATES: "each send is written at most once, and one producer's writes to a key land in the order "
                   "it sent them",
    ATOMIC_TRANSACTIONS: "an operation that sends and polls is one transaction read with "
                         "isolation.level=read_committed: its writes become visible together when it commits, "
                         "and it reads only committed writes",
    WRITE_ISOLATION: "the writes of one operation are isolated from other operations' writes (serializable "
                     "writes); Kafka never promises this",
    NO_LOST_CONSUMPTION: "a consumer group's committed offset passes only records some member processed (the "
                         "application commits after processing)",
    NO_DUPLICATE_CONSUMPTION: "a consumer group processes each record at most once (the application commits "
                              "before processing)",
}


@dataclass(frozen=True)
class AnomalyType:
    name: str
    description: str
    found_by: str  # ENGINE or CYCLES
    breaks: frozenset[str]  # the promises that, all held, rule the anomaly out
    never_bad: str = ""  # why a type that breaks no promise is still only reported

    def __post_init__(self) -> None:
        if self.found_by not in (ENGINE, CYCLES):
            raise ValueError(f"anomaly type {self.name}: found_by {self.found_by!r} is neither {ENGINE} nor {CYCLES}")
        unknown = sorted(self.breaks - set(PROMISES))
        if unknown:
            raise ValueError(f"anomaly type {self.name}: unknown promise(s) {', '.join(unknown)}")
        if not self.description:
            raise ValueError(f"anomaly type {self.name}: no description")
        if bool(self.breaks) == bool(self.never_bad):
            raise ValueError(f"anomaly type {self.name}: give the promises it breaks, or else why it is never bad")


def _t(name: str, found_by: str, breaks: tuple[str, ...], description: str, never_bad: str = "") -> AnomalyType:
    return AnomalyType(name, description, found_by, frozenset(breaks), never_bad)


_CYCLE_FLOW = "circular information flow"
REGISTRY: tuple[AnomalyType, ...] = (
    # --- the engines' types, in the order they report them ---
    _t("lost-write", ENGINE, (NO_LOSS,),
       "a send that certainly committed (acknowledged, or a value of its operation was read) is missing from the "
       "log: reads went past its offset without returning it, or the complete final log lacks it there"),
    _t("unseen", ENGINE, (NO_LOSS,),
       "at the end of the run, acknowledged sends that no ok poll ever returned (a count per key; informative "
       "while reads are still catching up, a loss once the final reads are done)"),
    _t("duplicate", ENGINE, (NO_DUPLICATES,),
       "one value stands at two or more offsets of a key, more offsets than producer sessions (processes) sent "
       "it: a producer wrote it twice"),
    _t("resent-duplicate", ENGINE, (),
       "one value stands at two or more offsets of a key, each offset accountable to a different producer session "
       "(process) that sent it: the application sent it again from a new session",
       never_bad="never promised: an idempotent producer drops its own retries within one session (its producer id "
                 "and epoch); a value the application sends again from a new producer is a new record to Kafka"),
    _t("inconsistent-offsets", ENGINE, (DURABLE_COMMITS,),
       "one offset of a key holds two or more different values (different readers saw different logs)"),
    _t("reused-offset", ENGINE, (NO_LOSS,),
       "an offset acknowledged for one value holds another value in the log: the acknowledged write was lost "
       "and its offset given to a later write"),
    _t("unexpected", ENGINE, (READABLE_LOG,),
       "a poll returned a value that no operation ever sent to that key"),
    _t("poll-skip", ENGINE, (CONSUMER_ORDER, DURABLE_COMMITS),
       "between two consecutive polls of one process on one key, the consumer skipped offsets that other "
       "operations show exist"),
    _t("nonmonotonic-poll", ENGINE, (CONSUMER_ORDER, DURABLE_COMMITS),
       "a process's later poll on a key started at or before the position its earlier poll had reached"),
    # Jepsen forbids it always. An operation is invoked only after the process's earlier one
    # completed, so without loss its sends land after the earlier ones; but where acknowledged
    # writes may be lost, a lost write's offset taken by a later send shows the same way.
    _t("nonmonotonic-send", ENGINE, (NO_LOSS,),
       "a process's later send to a key stands in the log (its version order: acknowledged offsets and "
       "what polls returned) at or below its earlier send"),
    _t("uncommitted-read", ENGINE, (DURABLE_COMMITS,),
       "an ok poll returned value v at offset o of key k, but the final log of k holds another value, or "
       "nothing, at o: a consumer saw data that the cluster later discarded"),
    _t("G1a", ENGINE, (NO_ABORTED_READS,),
       "aborted read: a poll (of any outcome) returned a value whose send certainly failed (refused, or its "
       "transaction aborted)"),
    _t("precommitted-read", ENGINE, (ATOMIC_TRANSACTIONS,),
       "an operation (of any outcome) polled a value that it had itself sent, before it committed"),
    # A key that a rebalance moved during the operation (its rebalance_log names it) is not judged,
    # so what is left is bad under subscribe too (Jepsen's int-poll-skip+nonmonotonic-cases).
    _t("int-poll-skip", ENGINE, (DURABLE_COMMITS,),
       "like poll-skip, within the records of a single operation, on a key no rebalance during the "
       "operation moved"),
    _t("int-nonmonotonic-poll", ENGINE, (DURABLE_COMMITS,),
       "like nonmonotonic-poll, within a single operation, on a key no rebalance during the operation moved"),
    _t("int-send-skip", ENGINE, (WRITE_ISOLATION, NO_LOSS),
       "two sends of one operation to one key are not adjacent in the log (by their version order: "
       "acknowledged offsets and what polls returned): other writes landed between them"),
    _t("int-nonmonotonic-send", ENGINE, (NO_DUPLICATES, NO_LOSS),
       "two sends of one operation to one key stand in the log (by their version order) in reverse order"),
    _t("lost-consumption", ENGINE, (NO_LOST_CONSUMPTION,),
       "a consumer group's committed offset of a key passed a record that no member processed (nor may have: "
       "a processing whose outcome is unknown counts as done)"),
    _t("duplicate-consumption", ENGINE, (NO_DUPLICATE_CONSUMPTION,),
       "a record that members of a consumer group certainly processed twice or more"),
    _t("ownership-overlap", ENGINE, (),
       "two consumers of a group held one key at once, by their rebalance logs: one was given the key before "
       "the other's consumer was told it was taken away (or before its process ended)",
       never_bad="never promised: a group coordinator gives away the keys of a member it expelled (its session "
                 "expired, or it was fenced) while that member, not yet told, goes on fetching; only its offset "
                 "commits are refused"),
    # --- the checker's cycle search ---
    _t("G0", CYCLES, (WRITE_ISOLATION, NO_LOSS),
       "write cycle: operations whose writes to two keys are ordered one way in one key's log and the other "
       "way in another's (write-write dependencies only)"),
    _t("G1c-ww", CYCLES, (WRITE_ISOLATION, ATOMIC_TRANSACTIONS, NO_LOSS),
       f"{_CYCLE_FLOW} that needs an inferred write-write dependency: a cycle of write-read and write-write "
       f"dependencies that no cycle of write-read dependencies alone explains"),
    # Write-read dependencies follow values, never offsets: a lost write cannot make one up.
    _t("G1c", CYCLES, (ATOMIC_TRANSACTIONS,),
       f"{_CYCLE_FLOW}: a cycle of write-read dependencies alone (each operation read a write of the one "
       f"before it)"),
    _t("G0-process", CYCLES, (WRITE_ISOLATION, NO_LOSS),
       "G0 closed by process order: a write cycle that exists only once each process's ok operations are taken "
       "to precede its later ones"),
    _t("G1c-ww-process", CYCLES, (WRITE_ISOLATION, ATOMIC_TRANSACTIONS, NO_LOSS),
       "G1c-ww closed by process order: it exists only with process order added, and needs a write-write "
       "dependency"),
    _t("G1c-process", CYCLES, (ATOMIC_TRANSACTIONS,),
       "G1c closed by process order: a cycle of write-read dependencies and process order, which exists only "
       "with process order added (e.g. a process polled a value that it sent only in a later operation)"),
    _t("G0-realtime", CYCLES, (WRITE_ISOLATION, NO_LOSS),
       "G0 closed by real-time order: a write cycle that exists only once an ok operation is taken to precede "
       "every operation invoked after it completed"),
    _t("G1c-ww-realtime", CYCLES, (WRITE_ISOLATION, ATOMIC_TRANSACTIONS, NO_LOSS),
       "G1c-ww closed by real-time order: it exists only with real-time order added, and needs a write-write "
       "dependency"),
    _t("G1c-realtime", CYCLES, (ATOMIC_TRANSACTIONS,),
       "G1c closed by real-time order: a cycle of write-read dependencies and real-time order, which exists "
       "only with real-time order added (e.g. a poll returned a value before its send was even invoked: a "
       "read from the future)"),
)

BY_NAME: dict[str, AnomalyType] = {t.name: t for t in REGISTRY}
if len(BY_NAME) != len(REGISTRY):
    raise ValueError("the anomaly registry names a type twice")


def names(found_by: str | None = None) -> tuple[str, ...]:
    """The registered types in registry order; only those `found_by` finds when given."""
    return tuple(t.name for t in REGISTRY if found_by is None or t.found_by == found_by)


def lookup(name: str) -> AnomalyType | None:
    return BY_NAME.get(name)

# Where each type comes from in Jepsen's Kafka checker (jepsen.tests.kafka, kafka.clj), and where
# faultline judges differently, why. Held to the registry by tests/test_guarantees.py.
JEPSEN: dict[str, tuple[str, str]] = {
    "lost-write": ("lost-write-cases", "also a committed write the complete final log lacks at its offset (a tail cut "
                                       "after it was read past), which needs the broker's end offsets"),
    "unseen": ("unseen", "counts acknowledged sends of info operations too (their offsets are recorded)"),
    "duplicate": ("duplicate-cases", "a value more than one producer session sent counts only when its offsets "
                                     "outnumber those sessions (else resent-duplicate)"),
    "resent-duplicate": ("duplicate-cases", "faultline's own split of Jepsen's duplicates: each offset accountable "
                                            "to another session that sent the value"),
    "inconsistent-offsets": ("version-orders (:errors)", ""),
    "reused-offset": ("-", "faultline's own: an acknowledged offset that holds another value"),
    "unexpected": ("-", "faultline's own: a value nobody sent (Jepsen throws no-writer-of-value)"),
    "poll-skip": ("poll-skip+nonmonotonic-cases", "records of a failed poll also move the chain (the consumer "
                                                  "moved past them), but a txn that failed or whose outcome is "
                                                  "unknown does not (rolled back, its consumer rewinds: Jepsen's "
                                                  "txn abort semantics); an ok assign with seek_to_beginning "
                                                  "naming the key rewinds it"),
    "nonmonotonic-poll": ("poll-skip+nonmonotonic-cases", "as poll-skip"),
    "nonmonotonic-send": ("nonmonotonic-send-cases", "Jepsen forbids it always; allowed where acknowledged writes "
                                                     "may be lost, since a lost write's offset taken by a later send "
                                                     "shows the same way; an assign does not reset a producer"),
    "uncommitted-read": ("-", "faultline's own: needs the final reads' complete log"),
    "G1a": ("g1a-cases", "readers of any outcome, not only ok: a failed poll's records are evidence"),
    "precommitted-read": ("precommitted-read-cases", ""),
    "int-poll-skip": ("int-poll-skip+nonmonotonic-cases", ""),
    "int-nonmonotonic-poll": ("int-poll-skip+nonmonotonic-cases", ""),
    "int-send-skip": ("int-send-skip+nonmonotonic-cases", "Jepsen always allows it; faultline forbids it only under "
                                                          "a model claiming write isolation"),
    "int-nonmonotonic-send": ("int-send-skip+nonmonotonic-cases", ""),
    "lost-consumption": ("-", "faultline's own: reads the consumers' process and commit operations"),
    "duplicate-consumption": ("-", "faultline's own: reads the consumers' process operations"),
    "ownership-overlap": ("-", "faultline's own: reads the rebalance logs' types (assigned, revoked, lost), "
                               "which Jepsen records but does not judge"),
    "G0": ("cycles! (ww-graph)", "Jepsen draws ww edges only with ww-deps; faultline always does, and allows the "
                                 "cycles that need them unless the model claims write isolation"),
    "G1c-ww": ("cycles! (ww-graph + wr-graph)", "Jepsen's G1c with ww-deps"),
    "G1c": ("cycles! (wr-graph)", "allowed where an operation that both sends and polls is not a transaction"),
    "G0-process": ("cycles! (ww-graph + process)", "as G0"),
    "G1c-ww-process": ("cycles! (ww-graph + wr-graph + process)", "as G1c-ww"),
    "G1c-process": ("cycles! (wr-graph + process)", "as G1c"),
    "G0-realtime": ("cycles! (ww-graph + realtime)", "as G0"),
    "G1c-ww-realtime": ("cycles! (ww-graph + wr-graph + realtime)", "as G1c-ww"),
    "G1c-realtime": ("cycles! (wr-graph + realtime)", "as G1c"),
}

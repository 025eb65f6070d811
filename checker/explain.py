"""Explanations: one witness of one anomaly type -> a sentence a person can follow.

In: the anomaly type and its witness (a dict of data: key, values, offsets,
ops). Out: a string. Rendering is kept apart from finding (as in Elle), so
the analysis engines only produce data.
"""

from __future__ import annotations

from typing import Any, Callable

from ..models.anomaly_types import CYCLES, names


def _ops(ops) -> str:
    ops = list(ops or [])
    return ", ".join(f"op {o}" for o in ops[:6]) + (f" and {len(ops) - 6} more" if len(ops) > 6 else "")


def _fmt(w: dict[str, Any], name: str, default: Any = "?") -> Any:
    value = w.get(name)
    return default if value is None else value


def _duplicate(w):
    offsets = w.get("offsets") or []
    pairs = ", ".join(str(o) for o in offsets)
    sends = w.get("sends") or []
    processes = sorted({s["process"] for s in sends})
    if len(sends) > 1:
        how = (f"sent {len(sends)} times, by processes {', '.join(map(str, processes))} (op "
               f"{', '.join(str(s['op']) for s in sends)}): the application sent it again"
               + (" from another producer session" if len(processes) > 1 else "")
               + ("; more offsets than sessions, so one of them wrote it twice"
                  if len(offsets) > len(processes) else ""))
    elif sends:
        how = (f"one send (op {sends[0]['op']}, process {sends[0]['process']}), several positions in the log: "
               "the producer wrote it twice in one session")
    else:
        how = "one send, several positions in the log"
    return (f"value {_fmt(w, 'value')} of {_fmt(w, 'key')} was read at offsets {pairs} "
            f"({_ops(w.get('ops'))}): {how}")


def _inconsistent(w):
    values = ", ".join(str(v) for v in (w.get("values") or []))
    return (f"offset {_fmt(w, 'offset')} of {_fmt(w, 'key')} held different values ({values}) "
            f"to different readers ({_ops(w.get('ops'))})")


def _unexpected(w):
    return (f"a poll ({_ops(w.get('ops'))}) returned value {_fmt(w, 'value')} at offset "
            f"{_fmt(w, 'offset')} of {_fmt(w, 'key')}, but no operation ever sent that value to that key")


def _lost(w):
    head = f"value {_fmt(w, 'value')} was acknowledged at offset {_fmt(w, 'offset')} of {_fmt(w, 'key')} "
    if "read_offset" not in w and "final_assign" in w:  # the complete final log lacks it
        return (head + f"({_ops([w.get('send_op')])}), but {_final_log(w)}: the write is gone")
    return (head + f"({_ops(w.get('ops'))}), and reads went past that offset (to {_fmt(w, 'read_offset')}) "
            f"without ever returning it: nobody will read it")


def _reused(w):
    return (f"value {_fmt(w, 'value')} was acknowledged at offset {_fmt(w, 'offset')} of {_fmt(w, 'key')} "
            f"({_ops([w.get('send_op')])}), but offset {_fmt(w, 'offset')} holds value {_fmt(w, 'other_value')} "
            f"({_ops([w.get('other_op')])}): the acknowledged write was lost and its offset reused")


def _unseen(w):
    count = _fmt(w, "count", 0)
    values = ", ".join(str(v) for v in (w.get("values") or [])[:8])
    return (f"{count} acknowledged value(s) of {_fmt(w, 'key')} were never returned by any poll"
            + (f" (e.g. {values}, sent by {_ops(w.get('ops'))})" if values else ""))


def _poll_skip(w):
    return (f"process {_fmt(w, 'process')} polled {_fmt(w, 'key')} up to offset {_fmt(w, 'prev_offset')}, "
            f"then its next poll started at {_fmt(w, 'next_offset')}, skipping "
            f"{_fmt(w, 'skipped_count', '')} offset(s) that exist ({_ops(w.get('ops'))})")


def _nonmonotonic_poll(w):
    return (f"process {_fmt(w, 'process')} polled {_fmt(w, 'key')} up to offset {_fmt(w, 'prev_offset')}, "
            f"then its next poll went back to offset {_fmt(w, 'next_offset')} ({_ops(w.get('ops'))})")


def _nonmonotonic_send(w):
    # Offsets here are positions in the version order: acknowledged, or where polls returned the value.
    return (f"process {_fmt(w, 'process')} sent value {_fmt(w, 'prev_value')} to {_fmt(w, 'key')}, which stands at "
            f"offset {_fmt(w, 'prev_offset')}, then in a later operation value {_fmt(w, 'next_value')}, which "
            f"stands at offset {_fmt(w, 'next_offset')}, not after it ({_ops(w.get('ops'))})")


def _final_log(w) -> str:
    """What the final log of the witness's key holds at its offset, and how it is known."""
    end, offset, key = w.get("final_end"), w.get("offset"), _fmt(w, "key")
    read = f"final read op {_fmt(w, 'final_assign')}"
    if end is not None and offset is not None and offset >= end:
        last = f"ends at offset {end - 1}" if end > 0 else "is empty"
        return f"the final log of {key} {last} ({read}, end offset {end} from the broker)"
    final = w.get("final_value")
    there = f"holds value {final} there" if final is not None else "holds nothing there"
    return f"the final log of {key} ({read}) {there}"


def _uncommitted(w):
    return (f"a poll ({_ops(w.get('ops'))}) read value {_fmt(w, 'value')} at offset {_fmt(w, 'offset')} of "
            f"{_fmt(w, 'key')}, but {_final_log(w)}: the consumer saw data the cluster later discarded")


def _aborted(w):
    return (f"a poll ({_ops([w.get('read_op')])}) returned value {_fmt(w, 'value')} at offset {_fmt(w, 'offset')} "
            f"of {_fmt(w, 'key')}, but the send of that value ({_ops([w.get('send_op')])}) certainly failed: "
            f"an aborted write was read")


def _precommitted(w):
    return (f"operation {_fmt(w, 'op')} of process {_fmt(w, 'process')} polled value {_fmt(w, 'value')} of "
            f"{_fmt(w, 'key')} (offset {_fmt(w, 'offset')}), which it had sent itself, before it committed")


def _int_poll_skip(w):
    return (f"one poll of process {_fmt(w, 'process')} ({_ops(w.get('ops'))}) returned offset "
            f"{_fmt(w, 'prev_offset')} of {_fmt(w, 'key')} and then {_fmt(w, 'next_offset')}, skipping "
            f"{_fmt(w, 'skipped_count', '')} offset(s) that exist")


def _int_nonmonotonic_poll(w):
    return (f"one poll of process {_fmt(w, 'process')} ({_ops(w.get('ops'))}) returned offset "
            f"{_fmt(w, 'prev_offset')} of {_fmt(w, 'key')} and then went back to {_fmt(w, 'next_offset')}")


def _int_send_skip(w):
    return (f"one operation of process {_fmt(w, 'process')} ({_ops(w.get('ops'))}) sent values "
            f"{_fmt(w, 'prev_value')} and {_fmt(w, 'next_value')} to {_fmt(w, 'key')}, which stand at offsets "
            f"{_fmt(w, 'prev_offset')} and {_fmt(w, 'next_offset')}: other writes landed between them")


def _int_nonmonotonic_send(w):
    return (f"one operation of process {_fmt(w, 'process')} ({_ops(w.get('ops'))}) sent value "
            f"{_fmt(w, 'prev_value')} to {_fmt(w, 'key')}, which stands at offset {_fmt(w, 'prev_offset')}, and then "
            f"value {_fmt(w, 'next_value')}, which stands at offset {_fmt(w, 'next_offset')}, not after it")


def _lost_consumption(w):
    return (f"the group committed offset {_fmt(w, 'committed')} of {_fmt(w, 'key')} ({_ops(w.get('ops'))}), past "
            f"offset {_fmt(w, 'offset')} (value {_fmt(w, 'value')}), which no member processed")


def _duplicate_consumption(w):
    return (f"offset {_fmt(w, 'offset')} of {_fmt(w, 'key')} (value {_fmt(w, 'value')}) was processed "
            f"{len(w.get('ops') or [])} times, by processes {', '.join(str(p) for p in w.get('processes') or [])} "
            f"({_ops(w.get('ops'))})")


def _ownership_overlap(w):
    held = w.get("held") or [{}, {}]

    def side(h: dict) -> str:
        until = (f"until op {h['until_op']} took it away or ended the process" if h.get("until_op") is not None
                 else "to the end of the history")
        return f"process {h.get('process', '?')} held it from op {h.get('since_op', '?')} {until}"

    return f"two consumers held {_fmt(w, 'key')} at once: {side(held[0])}; {side(held[-1])}"


def _cycle(w):
    said = {"ww": "wrote {key} before", "wr": "wrote a value of {key} that was read by",
            "process": "came before, in its process, and completed ok before",
            "realtime": "completed ok before the invocation of"}
    steps = "; ".join(f"op {st['from']} " + said.get(st["type"], "precedes ({key})").format(key=st["key"])
                      + f" op {st['to']}" for st in (w.get("steps") or [])[:8])
    more = f"; ... ({len(w['steps']) - 8} more steps)" if len(w.get("steps") or []) > 8 else ""
    return (f"{len(w.get('ops') or [])} operations form a dependency cycle ({_ops(w.get('ops'))}; "
            f"{_fmt(w, 'size')} in its component): {steps}{more}, back to the first")


# Keyed by the names of models/anomaly_types.py: a test holds these keys to exactly the registry's.
EXPLAINERS: dict[str, Callable[[dict], str]] = {
    "duplicate": _duplicate,
    "resent-duplicate": _duplicate,
    "inconsistent-offsets": _inconsistent,
    "reused-offset": _reused,
    "unexpected": _unexpected,
    "lost-write": _lost,
    "unseen": _unseen,
    "poll-skip": _poll_skip,
    "nonmonotonic-poll": _nonmonotonic_poll,
    "nonmonotonic-send": _nonmonotonic_send,
    "uncommitted-read": _uncommitted,
    "G1a": _aborted,
    "precommitted-read": _precommitted,
    "int-poll-skip": _int_poll_skip,
    "int-nonmonotonic-poll": _int_nonmonotonic_poll,
    "int-send-skip": _int_send_skip,
    "int-nonmonotonic-send": _int_nonmonotonic_send,
    "lost-consumption": _lost_consumption,
    "duplicate-consumption": _duplicate_consumption,
    "ownership-overlap": _ownership_overlap,
    **{kind: _cycle for kind in names(CYCLES)},
}


def explain(anomaly_type: str, witness: dict[str, Any]) -> str:
    explainer = EXPLAINERS.get(anomaly_type)
    if explainer is None:
        fields = ", ".join(f"{k}={v}" for k, v in witness.items() if k != "explanation")
        return f"{anomaly_type}: {fields}"
    return explainer(witness)

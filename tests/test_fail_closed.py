"""The verdict cannot lie: it is unknown when the history cannot show what the run claims, and it
catches an acknowledged write cut from the tail of a log.

Small hand-written histories, each checked with `faultline check --engine python` as a user would
(the catalog in tests/analysis holds the Spark engine to the same findings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
K = "t/0"


class H:
    """A history written line by line; `op` appends an invocation and its completion."""

    def __init__(self):
        self.lines: list[dict] = []

    def op(self, process, f, type_="ok", invoke=None, done=None, **fields) -> int:
        i = len(self.lines)
        self.lines.append({"index": i, "time": i, "process": process, "type": "invoke", "f": f, **fields,
                           **(invoke or {})})
        self.lines.append({"index": i + 1, "time": i + 1, "process": process, "type": type_, "f": f, **fields,
                           **(done or {})})
        return i + 1

    def send(self, process, pairs, type_="ok") -> int:
        mops = [{"f": "send", "key": K, "value": v} for v, _ in pairs]
        acked = [dict(m, offset=o) for m, (_, o) in zip(mops, pairs)] if type_ == "ok" else mops
        return self.op(process, "send", type_, invoke={"mops": mops}, done={"mops": acked})

    def assign(self, process, seek=True, final=False, ends=None, type_="ok") -> int:
        extra = {"final": True} if final else {}
        return self.op(process, "assign", type_, keys=[K], seek_to_beginning=seek, **extra,
                       done={"end_offsets": ends} if ends is not None and type_ == "ok" else None)

    def poll(self, process, records, final=False, type_="ok") -> int:
        extra = {"final": True} if final else {}
        recs = [{"key": K, "offset": o, "value": v} for o, v in records]
        return self.op(process, "poll", type_, invoke={"mops": [{"f": "poll"}], **extra},
                       done={"mops": [{"f": "poll", "records": recs}], **extra})

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "history.jsonl").write_text("".join(json.dumps(l) + "\n" for l in self.lines))
        return directory


def check(directory: Path, *extra: str) -> tuple[int, dict, str]:
    proc = subprocess.run([sys.executable, "-m", "faultline.runner.cli", "check", "--engine", "python",
                           "--no-progress", *extra, str(directory)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    return proc.returncode, json.loads((directory / "results.json").read_text()), proc.stdout + proc.stderr


def healthy() -> H:
    h = H()
    h.send(0, [(1, 0), (2, 1), (3, 2)])
    h.assign(1)
    h.poll(1, [(0, 1), (1, 2), (2, 3)])
    return h


def test_an_acknowledged_write_cut_from_the_tail_is_a_lost_write(tmp_path):
    h = healthy()
    final = h.assign(2, final=True, ends={K: 2})
    h.poll(2, [(0, 1), (1, 2)], final=True)
    status, results, out = check(h.write(tmp_path / "cut"))
    assert status == 1 and results["valid"] is False, out
    [lost] = results["anomalies"]["lost-write"]
    assert (lost["value"], lost["offset"], lost["final_end"], lost["final_assign"]) == (3, 2, 2, final)
    assert lost["explanation"] == ("value 3 was acknowledged at offset 2 of t/0 (op 1), but the final log of "
                                   "t/0 ends at offset 1 (final read op 7, end offset 2 from the broker): the "
                                   "write is gone")
    assert "lost-write" in results["bad_anomaly_types"]


def test_the_same_history_whose_final_reads_reach_the_end_is_valid(tmp_path):
    h = healthy()
    h.assign(2, final=True, ends={K: 3})
    h.poll(2, [(0, 1), (1, 2), (2, 3)], final=True)
    status, results, out = check(h.write(tmp_path / "whole"))
    assert (status, results["valid"], results["anomaly_types"]) == (0, True, []), out


def final_reads(h: H, process, end, read_to, outcome) -> int:
    return h.op(process, "final-reads", invoke={"final": True},
                done={"final": True, "final_reads": [{"key": K, "end": end, "read_to": read_to, "outcome": outcome}]})


def test_a_final_reader_whose_time_ran_out_before_it_began_leaves_the_verdict_to_those_that_read(tmp_path):
    # Reader 2 reads t/0 to its end; reader 3's predecessor's crash outlasted the final phase, so
    # it learned no end and read nothing before its time ran out: it says nothing of the log.
    h = healthy()
    h.assign(2, final=True, ends={K: 3})
    h.poll(2, [(0, 1), (1, 2), (2, 3)], final=True)
    final_reads(h, 2, 3, 3, "reached")
    final_reads(h, 3, None, 0, "timeout")
    status, results, out = check(h.write(tmp_path / "late"))
    assert (status, results["valid"], results["anomaly_types"]) == (0, True, []), out


def test_a_final_reader_that_learned_the_end_and_ran_out_of_time_makes_the_verdict_unknown(tmp_path):
    # The same, but the later reader learned where t/0 ends (it may have moved): it could not
    # read there in time, so the tail is not known.
    h = healthy()
    h.assign(2, final=True, ends={K: 3})
    h.poll(2, [(0, 1), (1, 2), (2, 3)], final=True)
    final_reads(h, 2, 3, 3, "reached")
    final_reads(h, 3, 3, 0, "timeout")
    status, results, out = check(h.write(tmp_path / "late"))
    assert (status, results["valid"]) == (2, "unknown"), out
    assert results["unknown_reasons"] == ["the final reads say they did not read 1 key(s) to the end: t/0: the "
                                          "final reads ran out of time before reaching the key's end"]


def test_a_run_where_nothing_succeeded_is_unknown(tmp_path):
    h = H()
    for p in range(5):
        h.send(p, [(p, None)], "info")
    h.poll(9, [], type_="fail")
    status, results, out = check(h.write(tmp_path / "nothing"))
    assert status == 2 and results["valid"] == "unknown", out
    assert results["unknown_reasons"] == ["no client operation completed ok (6 invoked): nothing happened that "
                                          "could be judged"]
    assert "unknown: no client operation completed ok" in out


def test_final_reads_short_of_the_end_offset_are_unknown(tmp_path):
    h = healthy()
    h.assign(2, final=True, ends={K: 3})
    h.poll(2, [(0, 1)], final=True)
    status, results, out = check(h.write(tmp_path / "short"))
    assert status == 2 and results["valid"] == "unknown", out
    assert results["unknown_reasons"] == ["the final reads did not reach the end of 1 key(s): t/0 read to offset 0 "
                                          "(final assign op 7), short of the broker's end offset 3"]


def test_an_end_heard_by_another_final_reader_after_the_chain_read_leaves_the_chain_whole(tmp_path):
    # Kafka 4.3.1, transactions: three final readers read t/0 to 401, past its last marker; then
    # the coordinator aborted a transaction left open, a marker at 401, and the fourth reader,
    # still reading, heard the end 402. The chain (the last rewind) read to where its reader heard
    # the log ends, and nothing showed a record beyond: the verdict stands.
    h = healthy()
    h.assign(3, final=True, ends={K: 4})
    h.assign(2, final=True, ends={K: 4})
    h.op(2, "poll", invoke={"mops": [{"f": "poll"}], "final": True},
         done={"mops": [{"f": "poll", "records": [{"key": K, "offset": o, "value": o + 1} for o in range(3)]}],
               "positions": {K: 4}, "final": True})
    h.assign(2, seek=False, final=True, ends={K: 4})
    final_reads(h, 2, 4, 4, "reached")
    h.op(3, "poll", invoke={"mops": [{"f": "poll"}], "final": True},
         done={"mops": [{"f": "poll", "records": [{"key": K, "offset": o, "value": o + 1} for o in range(3)]}],
               "positions": {K: 5}, "final": True})
    h.assign(3, seek=False, final=True, ends={K: 5})
    final_reads(h, 3, 5, 5, "reached")
    status, results, out = check(h.write(tmp_path / "marker"))
    assert (status, results["valid"], results["anomaly_types"]) == (0, True, []), out


def unsought() -> H:
    """Sends read back by a consumer that never rewound: nothing reads the logs from the start."""
    h = H()
    h.send(0, [(1, 0), (2, 1), (3, 2)])
    h.assign(1, seek=False)
    h.poll(1, [(0, 1), (1, 2), (2, 3)])
    return h


def test_keys_without_a_final_read_are_unknown(tmp_path):
    status, results, out = check(unsought().write(tmp_path / "no-seek"))
    assert (status, results["valid"]) == (2, "unknown"), out
    assert results["unknown_reasons"] == [
        "no final read of 1 key(s) (t/0): an assign with seek_to_beginning, then polls to the end of the log, "
        "shows whether the tail of a log was lost"]


def test_without_end_offsets_a_seek_chain_past_every_known_offset_is_complete(tmp_path):
    # A hand-written history with no end_offsets: the rewinding consumer read every offset any
    # operation showed, which is the best the history can say of the end.
    status, results, out = check(healthy().write(tmp_path / "no-ends"))
    assert (status, results["valid"], results["anomaly_types"]) == (0, True, []), out


def test_a_kind_of_operation_that_never_succeeded_is_unknown(tmp_path):
    h = H()
    h.send(0, [(1, None)], "fail")
    h.assign(1, final=True, ends={K: 0})
    h.poll(1, [], final=True)
    status, results, out = check(h.write(tmp_path / "no-send"))
    assert (status, results["valid"]) == (2, "unknown"), out
    assert results["unknown_reasons"] == ["no send completed ok (1 invoked): the run cannot show what its sends do"]


def test_a_failed_heal_is_unknown(tmp_path):
    h = healthy()
    h.op("nemesis", "heal", "info", done={"error": "RuntimeError: the broker on n1 exited"})
    h.assign(2, final=True, ends={K: 3})
    h.poll(2, [(0, 1), (1, 2), (2, 3)], final=True)
    status, results, out = check(h.write(tmp_path / "heal"))
    assert (status, results["valid"]) == (2, "unknown"), out
    assert results["unknown_reasons"] == ["the heal failed (op 6: RuntimeError: the broker on n1 exited): faults "
                                          "may have lasted into the final reads"]


def test_a_harness_failure_recorded_beside_the_history_is_unknown(tmp_path):
    h = healthy()
    h.assign(2, final=True, ends={K: 3})
    h.poll(2, [(0, 1), (1, 2), (2, 3)], final=True)
    directory = h.write(tmp_path / "harness")
    (directory / "harness-errors.jsonl").write_text(json.dumps(
        {"error": "HarnessError: worker 1 failed", "traceback": "Traceback ..."}) + "\n")
    status, results, out = check(directory)
    assert (status, results["valid"]) == (2, "unknown"), out
    assert results["unknown_reasons"] == ["the harness failed during the run (HarnessError: worker 1 failed); see "
                                          "harness-errors.jsonl"]


def test_an_anomaly_found_stays_proven_when_the_history_is_also_incomplete(tmp_path):
    h = unsought()
    h.poll(1, [(0, 7)])  # value 7 was never sent
    status, results, out = check(h.write(tmp_path / "both"))
    assert (status, results["valid"]) == (1, False), out
    assert "unexpected" in results["bad_anomaly_types"] and results["unknown_reasons"]


def test_a_run_stopped_before_its_final_reads_is_unknown_not_invalid_on_unseen_values(tmp_path):
    # A consumer rewound and read the log to its end early on; sends went on after it, and the run
    # stopped before any final read. That rewind is the last one, but the log grew after it: it is
    # not the final log, and the values nobody read yet are not lost.
    h = H()
    h.send(0, [(1, 0)])
    h.assign(1, ends={K: 1})
    h.poll(1, [(0, 1)])
    late = h.send(0, [(2, 1), (3, 2)])
    status, results, out = check(h.write(tmp_path / "stopped"))
    assert (status, results["valid"]) == (2, "unknown"), out
    assert results["anomaly_types"] == ["unseen"] and results["unproven_anomaly_types"] == ["unseen"]
    assert results["unknown_reasons"] == [
        "the final reads did not reach the end of 1 key(s): t/0 read to offset 0 (final assign op 3), short of "
        "offset 2, which operations that completed after that assign show exists"]
    [unseen] = results["anomalies"]["unseen"]
    assert (unseen["values"], unseen["ops"]) == ([2, 3], [late, late])


def test_unseen_values_on_a_key_whose_final_reads_are_complete_are_a_loss(tmp_path):
    h = H()
    # The broker's log now ends after offset 0: the value acknowledged at offset 1 is gone.
    h.send(0, [(1, 0), (2, 1)])
    h.assign(2, final=True, ends={K: 1})
    h.poll(2, [(0, 1)], final=True)
    status, results, out = check(h.write(tmp_path / "lost"))
    assert (status, results["valid"]) == (1, False), out
    assert "unproven_anomaly_types" not in results and {"unseen", "lost-write"} <= set(results["bad_anomaly_types"])

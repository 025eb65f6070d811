"""Synthetic, valid queue histories of any size, for benchmarks and for warming the checker.

In: a path, a number of operations (invocations), processes, keys and a seed. Out: a history
file (docs/history-format.md) of sends of 1..3 values and polls reading on from each consumer's
position over a correct log, then the final reads of every key from the beginning, so every
acknowledged value is seen: a checker must call it valid. Written with string formatting, at
about a million operations in 10 s; then, as the harness's writer does, its side-car
(operations_table: about a million operations a minute), unless `sidecar` is false.
"""

from __future__ import annotations

import random
from pathlib import Path


def write_history(path: Path, ops: int, processes: int = 10, keys: int = 20, seed: int = 0,
                  sidecar: bool = True) -> None:
    """Write the history; see the module docstring."""
    rng = random.Random(seed)
    key_names = [f"t/{k}" for k in range(keys)]
    logs: list[list[int]] = [[] for _ in range(keys)]
    positions = [[0] * keys for _ in range(processes)]
    next_value = 0
    index = 0
    t = 0
    with open(path, "w", buffering=1 << 20) as f:
        w = f.write
        for n in range(ops):
            p = n % processes
            t += 1000
            if rng.random() < 0.5:
                mops_inv, mops_ok = [], []
                for _ in range(rng.randint(1, 3)):
                    k = rng.randrange(keys)
                    v = next_value
                    next_value += 1
                    off = len(logs[k])
                    logs[k].append(v)
                    mops_inv.append(f'{{"f":"send","key":"{key_names[k]}","value":{v}}}')
                    mops_ok.append(f'{{"f":"send","key":"{key_names[k]}","value":{v},"offset":{off}}}')
                w(f'{{"index":{index},"time":{t},"process":{p},"type":"invoke","f":"send","mops":[{",".join(mops_inv)}]}}\n')
                w(f'{{"index":{index + 1},"time":{t + 500},"process":{p},"type":"ok","f":"send","mops":[{",".join(mops_ok)}]}}\n')
            else:
                k = rng.randrange(keys)
                start = positions[p][k]
                end = min(len(logs[k]), start + rng.randint(0, 12))
                positions[p][k] = end
                recs = ",".join(f'{{"key":"{key_names[k]}","offset":{o},"value":{logs[k][o]}}}'
                                for o in range(start, end))
                w(f'{{"index":{index},"time":{t},"process":{p},"type":"invoke","f":"poll","mops":[{{"f":"poll"}}]}}\n')
                w(f'{{"index":{index + 1},"time":{t + 500},"process":{p},"type":"ok","f":"poll","mops":[{{"f":"poll","records":[{recs}]}}]}}\n')
            index += 2
        # The final reads, as the runner's final phase does: one consumer reads every key from the
        # beginning.
        t += 1000
        assign = '{"f":"assign","keys":[' + ",".join(f'"{k}"' for k in key_names) + '],"seek_to_beginning":true}'
        w(f'{{"index":{index},"time":{t},"process":0,"type":"invoke",{assign[1:]}\n')
        w(f'{{"index":{index + 1},"time":{t + 1},"process":0,"type":"ok",{assign[1:]}\n')
        index += 2
        for k in range(keys):
            for start in range(0, len(logs[k]), 1000):
                t += 1000
                recs = ",".join(f'{{"key":"{key_names[k]}","offset":{o},"value":{logs[k][o]}}}'
                                for o in range(start, min(start + 1000, len(logs[k]))))
                w(f'{{"index":{index},"time":{t},"process":0,"type":"invoke","f":"poll","mops":[{{"f":"poll"}}]}}\n')
                w(f'{{"index":{index + 1},"time":{t + 1},"process":0,"type":"ok","f":"poll","mops":[{{"f":"poll","records":[{recs}]}}]}}\n')
                index += 2
    if sidecar:
        from .operations_table import build

        build(path)

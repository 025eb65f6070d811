"""Claims about Kafka's reliability as experiments: claim files -> Claim values, and how the runs
of a claim are judged.

In: the TOML files of `models/claims/` (one claim each; docs/claims.md describes the format), and
for judging, the results (results.json's dicts) of a side's runs. Out: `Claim`s that say, per
system (the reference broker, Apache Kafka of a version), the spec fields of each side's runs and
what each side is expected to show; `judge_side` and `judge_claim`, pure functions that turn
results into the words of the claims table (REPRODUCED / NOT REPRODUCED, HELD / VIOLATED,
CONFIRMED / CONTRADICTED / UNDECIDED, n/a).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .anomaly_types import names
from .spec import SpecError

CLAIMS_DIR = Path(__file__).parent / "claims"
SYSTEMS = ("reference", "kafka")
SIDES = ("unsafe", "safe")
# Settings given as tables are merged key by key, a side's over the claim's; other fields replace.
TABLES = ("producer", "consumer", "broker_settings", "kafka_features")

REPRODUCED, NOT_REPRODUCED, HELD, VIOLATED = "REPRODUCED", "NOT REPRODUCED", "HELD", "VIOLATED"
CONFIRMED, CONTRADICTED, UNDECIDED, NA = "CONFIRMED", "CONTRADICTED", "UNDECIDED", "n/a"


class ClaimError(ValueError):
    """A claim file that cannot be used: the file, what is wrong, and how to fix it."""


@dataclass(frozen=True)
class Side:
    """One configuration of a claim on one system: the spec fields of its runs; `anomalies`: the
    types that show the claim (at least one expected on an unsafe side, none allowed on a safe
    one); `expect_anomaly`: whether this side is expected to show one."""
    name: str
    fields: dict[str, Any]
    anomalies: tuple[str, ...]
    expect_anomaly: bool


@dataclass(frozen=True)
class Plan:
    """A claim on one system: its sides, or why it does not apply (`na`); `note`: a version's
    reason for expecting otherwise."""
    claim: "Claim"
    system: str
    sides: tuple[Side, ...] = ()
    na: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class Claim:
    name: str
    claim: str
    source: str
    why: str  # why the runs are set up so (settings that widen a window)
    systems: tuple[str, ...]
    run: dict[str, Any]
    sides: dict[str, dict[str, Any]]
    per_system: dict[str, dict[str, Any]] = field(default_factory=dict)
    versions: tuple[dict[str, Any], ...] = ()
    quick: dict[str, Any] = field(default_factory=dict)
    na: dict[str, str] = field(default_factory=dict)

    def plan(self, system: str, kafka_version: str | None = None, quick: bool = False) -> Plan:
        """The runs of this claim on `system` ("reference" or "kafka", at `kafka_version`)."""
        if system not in self.systems:
            return Plan(self, system, na=self.na.get(system) or f"the claim is about {', '.join(self.systems)}")
        rule = next((v for v in self.versions if v.get("system") == system
                     and str(kafka_version or "").startswith(str(v.get("version", "")))), {})
        if rule.get("na"):
            return Plan(self, system, na=rule["na"])
        base = _merge(self.run, {"broker": system, **({"kafka_version": kafka_version} if kafka_version else {})})
        base = _merge(base, self.per_system.get(system, {}))
        base = _merge(base, rule.get("run") or {})
        if quick:
            base = _merge(base, self.quick)
        sides = []
        for name in SIDES:
            side = self.sides.get(name)
            if side is None:
                continue
            expect = name == "unsafe" and rule.get("unsafe_reproduces", True)
            kinds = tuple(side.get("expect" if name == "unsafe" else "forbid") or ())
            sides.append(Side(name, _merge(base, side.get("run") or {}), kinds, bool(expect)))
        return Plan(self, system, tuple(sides), note=rule.get("why"))


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = {**(out.get(k) or {}), **v} if k in TABLES and isinstance(v, dict) else v
    return out


def load_claim(path: Path) -> Claim:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ClaimError(f"{path}: cannot be read as TOML ({exc}); see docs/claims.md for the format") from None

    def need(key: str, kind: type, where: dict = data, at: str = ""):
        value = where.get(key)
        if not isinstance(value, kind):
            raise ClaimError(f"{path}: {at}{key} must be a {kind.__name__}, found {value!r}; see docs/claims.md")
        return value

    known = set(names())
    sides = {s: data[s] for s in SIDES if s in data}
    if not sides:
        raise ClaimError(f"{path}: no [unsafe] or [safe] table: a claim needs a configuration to run")
    for s, side in sides.items():
        kinds = need("expect" if s == "unsafe" else "forbid", list, side, f"[{s}] ")
        unknown = [k for k in kinds if k not in known]
        if not kinds or unknown:
            raise ClaimError(f"{path}: [{s}] names {'no anomaly type' if not kinds else ', '.join(unknown)}: give "
                             f"types of models/anomaly_types.py (e.g. lost-write, duplicate)")
    systems = tuple(need("systems", list))
    if not systems or set(systems) - set(SYSTEMS):
        raise ClaimError(f"{path}: systems must list some of {', '.join(SYSTEMS)}, found {systems!r}")
    return Claim(name=path.stem, claim=need("claim", str), source=need("source", str), why=data.get("why", ""),
                 systems=systems, run=data.get("run") or {}, sides=sides,
                 per_system={s: (data.get(s) or {}).get("run") or {} for s in SYSTEMS},
                 versions=tuple(data.get("versions") or ()), quick=data.get("quick") or {}, na=data.get("na") or {})


def load_claims(directory: Path = CLAIMS_DIR, only: list[str] | None = None) -> list[Claim]:
    """Every claim of `directory` (sorted by name), or those named in `only`."""
    claims = [load_claim(p) for p in sorted(directory.glob("*.toml"))]
    if only:
        missing = sorted(set(only) - {c.name for c in claims})
        if missing:
            raise SpecError(f"no claim named {', '.join(missing)}; the claims are: "
                            f"{', '.join(c.name for c in claims)}")
        claims = [c for c in claims if c.name in only]
    return claims


@dataclass(frozen=True)
class Outcome:
    """A side judged over its runs: `verdict` (REPRODUCED, NOT REPRODUCED, HELD, VIOLATED, or
    UNDECIDED for a clean side with runs that ended unknown), `showing` (runs whose anomaly types
    include one of the side's), `known` (runs with a verdict), `runs`, and the index of the first
    run showing one (the witness)."""
    verdict: str
    showing: int
    known: int
    runs: int
    first: int | None


def judge_side(side: Side, results: list[dict[str, Any]]) -> Outcome:
    """A side, from its runs' results (a run's types are its `anomaly_types` less its
    `unproven_anomaly_types`): a side expected to show an anomaly REPRODUCED it when a run
    with a verdict found one of its types, else NOT REPRODUCED; a side expected clean VIOLATED it
    when any run found one (whatever its verdict), else HELD when every run had a verdict, else
    UNDECIDED; a side without runs (all stopped) is UNDECIDED."""
    if not results:
        return Outcome(UNDECIDED, 0, 0, 0, None)  # no run finished: nothing is shown either way
    found = [bool(set(r.get("anomaly_types") or []) - set(r.get("unproven_anomaly_types") or [])
                  & set(side.anomalies)) for r in results]
    known = [r.get("valid") in (True, False) for r in results]
    first = next((i for i, f in enumerate(found) if f), None)
    if side.expect_anomaly:
        showing = sum(f and k for f, k in zip(found, known))
        verdict = REPRODUCED if showing else NOT_REPRODUCED
        first = next((i for i, (f, k) in enumerate(zip(found, known)) if f and k), None)
    else:
        showing = sum(found)
        verdict = VIOLATED if showing else HELD if all(known) else UNDECIDED
    return Outcome(verdict, showing, sum(known), len(results), first)


def judge_claim(outcomes: dict[str, tuple[Side, Outcome]]) -> str:
    """CONTRADICTED when a side expected clean was VIOLATED; CONFIRMED when every side expected
    to show an anomaly REPRODUCED it and every clean side HELD; UNDECIDED otherwise."""
    sides = list(outcomes.values())
    if any(not s.expect_anomaly and o.verdict == VIOLATED for s, o in sides):
        return CONTRADICTED
    if sides and all(o.verdict == (REPRODUCED if s.expect_anomaly else HELD) for s, o in sides):
        return CONFIRMED
    return UNDECIDED

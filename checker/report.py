"""report.html: a run to look at before reading it.

In: a store folder holding history.jsonl, and optionally test.json, results.json (or the results
given), anomalies/*.jsonl and nodes/<node>/*.log. Out: `report.html` in that folder, one
self-contained file (plots are inline SVG drawn by matplotlib; no script, font or style is
fetched from anywhere): the verdict and how to reproduce the run; latency of every client
operation, latency quantiles, throughput, realtime lag and unseen acknowledged messages over
time, each with the faults shaded; per anomaly type its count, whether the model allows it, the
explained examples and a timeline of each example's operations; links to the run's files.

The data comes from history_analysis.timeline; rendering is all here.
"""

from __future__ import annotations

import html
import io
import json
import logging
import math
import os
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..history_analysis.timeline import QUANTILES, Timeline, read_timeline
from ..models.faults import Fault

log = logging.getLogger("faultline.checker")

REPORT = "report.html"
# The plain-Python timeline holds the history in memory (about 8 bytes per byte of history):
# larger histories are drawn from Spark's figures (spark_timeline) when the check has a session,
# and reported without plots otherwise, unless FAULTLINE_REPORT_MAX_MB says otherwise.
MAX_HISTORY_MB = 128
WITNESS_OPS = 12
COLOURS = {"ok": "#3b82c4", "fail": "#e0457b", "info": "#f0a030"}
MARKERS = {"send": "o", "poll": "^", "txn": "s"}
FAULT_COLOURS = ["#d9534f", "#5b8def", "#9b59b6", "#e6a23c", "#2bbbad", "#8d6e63", "#607d8b"]
VERDICTS = {True: ("VALID", "valid"), False: ("INVALID", "invalid"), "unknown": ("UNKNOWN", "unknown")}

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1180px;
       padding: 0 24px 48px; color: #1d2330; }
header { padding: 18px 0 8px; border-bottom: 1px solid #d8dde6; }
h1 { font-size: 22px; margin: 8px 0; }
h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #e3e7ee; padding-bottom: 4px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.verdict { display: inline-block; padding: 3px 12px; border-radius: 4px; color: #fff; font-weight: 600;
           letter-spacing: .04em; }
.verdict.valid { background: #2e8b57; } .verdict.invalid { background: #c0392b; }
.verdict.unknown { background: #7f8c8d; }
code, pre { font: 12.5px/1.4 ui-monospace, "DejaVu Sans Mono", monospace; background: #f4f6f9;
            border-radius: 3px; }
code { padding: 1px 4px; } pre { padding: 8px 10px; overflow-x: auto; white-space: pre-wrap; }
table { border-collapse: collapse; margin: 6px 0; }
th, td { text-align: left; padding: 3px 10px 3px 0; vertical-align: top; }
th { font-weight: 600; color: #4a5568; }
td.bad, .forbidden { color: #c0392b; font-weight: 600; } td.allowed { color: #4a5568; }
figure { margin: 10px 0 18px; } figcaption { color: #4a5568; font-size: 13px; }
svg { max-width: 100%; height: auto; }
.note { color: #4a5568; } ul.files { columns: 2; }
.example { margin: 8px 0 14px; }
.settings { display: flex; flex-wrap: wrap; gap: 4px 18px; font-size: 13px; color: #2d3748; }
.settings b { color: #4a5568; font-weight: 600; margin-right: 3px; }
"""


def _svg(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _figure(plot_id: str, caption: str, svg: str) -> str:
    return (f'<figure id="plot-{plot_id}" class="plot">{svg}'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _fault_colour(faults: list[Fault]) -> dict[str, str]:
    return {f: FAULT_COLOURS[i % len(FAULT_COLOURS)] for i, f in enumerate(sorted({x.f for x in faults}))}


def _shade(ax, faults: list[Fault], end: float, colours: dict[str, str], label: bool = False,
           prefix: str = "") -> None:
    """Each fault as a band over `ax`: an SVG group `<prefix>-fault-<i>` when a prefix is given."""
    for i, x in enumerate(faults):
        ax.axvspan(x.start, x.end if x.end is not None else end, color=colours[x.f], alpha=0.13, lw=0,
                   gid=f"{prefix}-fault-{i}" if prefix else None)
        if label:
            ax.text(x.start, 1.0, f" {x.f}{_who(x.value)}", transform=ax.get_xaxis_transform(), fontsize=7,
                    va="top", ha="left", color=colours[x.f], clip_on=True)


def _who(value: Any) -> str:
    """Which nodes a fault hit (its `nodes`), or the shape of a partition, for a band's label."""
    if not isinstance(value, dict):
        return ""
    nodes = value.get("nodes")
    if isinstance(nodes, list) and nodes and all(isinstance(n, str) for n in nodes):
        return " " + ",".join(nodes)
    return f" ({value['shape']})" if isinstance(value.get("shape"), str) else ""


def _axes(t: Timeline, colours: dict[str, str], prefix: str, title: str, ylabel: str, label: bool = False):
    """A plot over the run's whole time, its faults shaded (SVG groups `<prefix>-fault-<i>`)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 3.2))
    # Fixed margins that fit the labels: a tight bounding box would lay every plot out twice.
    fig.subplots_adjust(left=0.065, right=0.99, bottom=0.15, top=0.9)
    ax.set_title(title, fontsize=11, loc="left")
    ax.set_xlabel("time since the history began (s)", fontsize=9)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.25, lw=0.5)
    ax.set_xlim(0, max(t.end, 1e-3))
    _shade(ax, t.faults, t.end, colours, label=label, prefix=prefix)
    return fig, ax


def _log_scale(ax) -> None:
    """A log y axis labelled in plain numbers (0.001, 0.01, ...), not TeX's powers of ten, whose
    typesetting took a quarter of a report's time."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _latency_plot(t: Timeline, colours: dict[str, str]) -> str:
    fig, ax = _axes(t, colours, "latency", "latency of every client operation", "latency (s)", label=True)
    kept = t.ops
    for type_ in ("ok", "info", "fail"):
        for f in sorted({o.f for o in kept if o.type == type_}):
            pts = [o for o in kept if o.type == type_ and o.f == f]
            ax.scatter([o.invoke for o in pts], [max(o.latency, 1e-5) for o in pts], s=7, alpha=0.7,
                       c=COLOURS[type_], marker=MARKERS.get(f, "."), lw=0, label=f"{f} {type_} ({len(pts)})")
    if kept:
        _log_scale(ax)
        ax.legend(fontsize=7, loc="upper right", ncol=3, markerscale=1.6)
    note = "" if len(kept) == t.completed else (f" ({len(kept)} of {t.completed} drawn: the slowest, the fail and "
                                                 f"info ones unless too many, and an even sample of the rest)")
    note += f"; {t.never} operation(s) never completed (not drawn)" if t.never else ""
    return _figure("latency", "One point per completed client operation, at its invocation; colour: outcome (ok blue, "
                   "info orange, fail pink); shape: send circle, poll triangle, txn square, others dot. Shaded: "
                   "faults." + note, _svg(fig))


def _quantile_plot(t: Timeline, colours: dict[str, str]) -> str:
    fig, ax = _axes(t, colours, "quantiles", "latency quantiles per second", "latency (s)")
    rows = t.quantiles
    for q in QUANTILES:
        name = "max" if q == 1.0 else f"p{round(q * 100)}"
        ax.plot([s + 0.5 for s, _ in rows], [max(v[q], 1e-5) for _, v in rows], lw=1.2, marker=".", ms=3, label=name)
    if rows:
        _log_scale(ax)
        ax.legend(fontsize=8, loc="upper right", ncol=4)
    return _figure("quantiles", "Per second of invocation, the latency below which 50%, 95% and 99% of the "
                   "completed operations invoked in it finished, and the slowest.", _svg(fig))


def _throughput_plot(t: Timeline, colours: dict[str, str]) -> str:
    fig, ax = _axes(t, colours, "throughput", "throughput", "completions per second")
    for type_, series in t.throughput.items():
        if any(n for _, n in series):
            ax.plot([s + 0.5 for s, _ in series], [n for _, n in series], lw=1.2, color=COLOURS[type_],
                    label=type_)
    if ax.get_lines():  # a history without completions has nothing to label
        ax.legend(fontsize=8, loc="upper right", ncol=3)
    return _figure("throughput", "Client operations completed in each second, by outcome.", _svg(fig))


def _top_keys(series: dict[str, Any], weight, n: int = 10) -> tuple[list[str], int]:
    keys = sorted(series, key=lambda k: (-weight(series[k]), k))
    return sorted(keys[:n]), max(0, len(keys) - n)


def _lag_plot(t: Timeline, colours: dict[str, str]) -> str:
    fig, ax = _axes(t, colours, "lag", "realtime lag by key", "lag (s)")
    by_key: dict[str, dict[float, float]] = {}
    for x in t.lag:
        at = by_key.setdefault(x.key, {})
        at[x.time] = max(at.get(x.time, 0.0), x.lag)
    keys, others = _top_keys(by_key, lambda at: max(at.values()))
    for key in keys:
        pts = sorted(by_key[key].items())
        ax.plot([p[0] for p in pts], [p[1] for p in pts], ls="", marker=".", ms=3, label=key)
    if keys:
        ax.legend(fontsize=7, loc="upper right", ncol=4)
    more = f" The {others} other key(s) with smaller lag are not drawn." if others else ""
    return _figure("lag", "For each ok poll, per key its consumer had read: how long before the poll was invoked "
                   "the record after the last one it had seen was known to exist (Jepsen's realtime lag); "
                   "the worst per key and instant." + more, _svg(fig))


def _unseen_plot(t: Timeline, colours: dict[str, str]) -> str:
    fig, ax = _axes(t, colours, "unseen", "unseen acknowledged messages", "messages")
    keys, others = _top_keys(t.unseen, lambda s: max(c for _, c in s))
    for key in keys:
        series = t.unseen[key] + [(t.end, t.unseen[key][-1][1])]
        ax.step([p[0] for p in series], [p[1] for p in series], where="post", lw=1, label=key)
    if keys:
        ax.legend(fontsize=7, loc="upper right", ncol=4)
    more = f" The {others} other key(s) are not drawn." if others else ""
    return _figure("unseen", "Per key, the acknowledged sends that no ok poll had returned yet; what is still "
                   "unseen at the end of the run was never read." + more, _svg(fig))


def _ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """Round tick positions within [lo, hi]."""
    raw = (hi - lo) / n
    step = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step = next(m * step for m in (1, 2, 5, 10) if m * step >= raw)
    return [i * step for i in range(math.ceil(lo / step), math.floor(hi / step) + 1)]


def _witness_plot(t: Timeline, ops: list[int], colours: dict[str, str], plot_id: str) -> str:
    """A witness's operations as bars from invocation to completion (one row each, coloured by
    outcome) over the faults of their time: SVG written directly (one per example: matplotlib
    would take a tenth of a second each)."""
    found = [o for o in (t.op(x) for x in ops[:WITNESS_OPS]) if o is not None]
    if not found:
        return ""
    e = html.escape
    left, width, row_h, top = 250, 620, 18, 16
    lo = min(o.invoke for o in found)
    hi = max(o.complete if o.complete is not None else t.end for o in found)
    pad = max((hi - lo) * 0.15, 0.05)
    lo, hi = lo - pad, hi + pad

    def x(v: float) -> float:
        return left + (min(max(v, lo), hi) - lo) / (hi - lo) * width

    height = top + row_h * len(found) + 28
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 10}" height="{height}" '
             f'viewBox="0 0 {left + width + 10} {height}" font-family="sans-serif" font-size="11">']
    for i, f in enumerate(x_ for x_ in t.faults if (x_.end if x_.end is not None else t.end) >= lo and x_.start <= hi):
        a, b = x(f.start), x(f.end if f.end is not None else t.end)
        parts.append(f'<g id="{plot_id}-fault-{i}"><rect x="{a:.1f}" y="{top - 12}" width="{max(b - a, 1):.1f}" '
                     f'height="{row_h * len(found) + 12}" fill="{colours[f.f]}" fill-opacity="0.13"/>'
                     f'<text x="{a + 2:.1f}" y="{top - 3}" fill="{colours[f.f]}" font-size="9">{e(f.f + _who(f.value))}'
                     f"</text></g>")
    for v in _ticks(lo, hi):
        parts.append(f'<line x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{top}" y2="{top + row_h * len(found)}" '
                     f'stroke="#d0d5dd" stroke-width="0.5"/><text x="{x(v):.1f}" y="{top + row_h * len(found) + 13}" '
                     f'text-anchor="middle" font-size="9" fill="#4a5568">{v:g}</text>')
    for row, o in enumerate(found):
        y = top + row * row_h
        end = o.complete if o.complete is not None else t.end
        a, b = x(o.invoke), x(end)
        what = f"op {o.op}, process {o.process}: {o.f} {o.type}, {o.invoke:.3f} s to " + (
            f"{o.complete:.3f} s" if o.complete is not None else "never completed")
        parts.append(f'<text x="{left - 8}" y="{y + 12}" text-anchor="end">op {o.op}  process {o.process}  '
                     f'{e(o.f)} {o.type}</text><rect x="{a:.1f}" y="{y + 3}" width="{max(b - a, 2):.1f}" '
                     f'height="{row_h - 6}" fill="{COLOURS.get(o.type, "#999")}"><title>{e(what)}</title></rect>')
    parts.append(f'<text x="{left + width / 2}" y="{height - 2}" text-anchor="middle" font-size="9" fill="#4a5568">'
                 f"time since the history began (s)</text></svg>")
    return f'<figure id="{plot_id}" class="timeline">{"".join(parts)}</figure>'


def _settings(spec: dict[str, Any]) -> str:
    rows = []
    for name in ("name", "workload", "broker", "kafka_version", "kafka_mode", "backend", "nodes", "time_limit",
                 "rate", "concurrency", "partitions", "nemesis", "nemesis_interval", "model", "engine"):
        if spec.get(name) not in (None, [], {}):
            rows.append((name, spec[name]))
    for name in ("producer", "consumer", "broker_settings"):
        if isinstance(spec.get(name), dict) and spec[name]:
            rows.append((name, ", ".join(f"{k}={v}" for k, v in spec[name].items())))
        elif spec.get(name):
            rows.append((name, spec[name]))
    return '<div class="settings">' + "".join(f"<span><b>{html.escape(str(k))}</b> {html.escape(str(v))}</span>"
                                              for k, v in rows) + "</div>"


def _files(directory: Path) -> str:
    names = [n for n in ("history.jsonl", "results.json", "test.json", "clients.log", "harness.json",
                         "harness-errors.jsonl")
             if (directory / n).exists()]
    names += sorted(str(p.relative_to(directory)) for p in (directory / "anomalies").glob("*.jsonl")
                    if p.stat().st_size > 0) if (directory / "anomalies").is_dir() else []
    names += sorted(str(p.relative_to(directory)) for p in (directory / "nodes").glob("*/*") if p.is_file()) \
        if (directory / "nodes").is_dir() else []
    return '<ul class="files">' + "".join(f'<li><a href="{html.escape(n)}">{html.escape(n)}</a></li>'
                                          for n in names) + "</ul>"


def _anomalies(results: dict[str, Any], t: Timeline | None, colours: dict[str, str]) -> str:
    types = results.get("anomaly_types") or []
    if not types:
        return "<p>No anomaly of any type was found.</p>"
    bad = set(results.get("bad_anomaly_types") or [])
    out = ["<table><tr><th>type</th><th>count</th><th>under the model</th></tr>"]
    for kind in types:
        cls, said = ("bad", "forbidden") if kind in bad else ("allowed", "allowed")
        out.append(f'<tr><td><a href="#anomaly-{html.escape(kind)}">{html.escape(kind)}</a></td>'
                   f'<td>{results["counts"].get(kind, 0)}</td><td class="{cls}">{said}</td></tr>')
    out.append("</table>")
    for kind in types:
        examples = results.get("anomalies", {}).get(kind, [])
        out.append(f'<h3 id="anomaly-{html.escape(kind)}">{html.escape(kind)}: {results["counts"].get(kind, 0)}'
                   f'{" (forbidden by the model)" if kind in bad else " (allowed by the model)"}</h3>')
        for i, w in enumerate(examples):
            out.append(f'<div class="example"><p>{html.escape(w.get("explanation") or json.dumps(w))}</p>')
            if t is not None:
                out.append(_witness_plot(t, [o for o in w.get("ops") or [] if isinstance(o, int)], colours,
                                         f"witness-{kind}-{i}"))
            out.append("</div>")
        if examples:
            out.append(f'<p class="note">Every witness: <a href="anomalies/{html.escape(kind)}.jsonl">'
                       f"anomalies/{html.escape(kind)}.jsonl</a>.</p>")
    return "\n".join(out)


def _faults_table(t: Timeline, colours: dict[str, str]) -> str:
    if not t.faults:
        return "<p>No fault was injected.</p>"
    rows = "".join(
        f'<tr><td style="color:{colours[x.f]}">&#9632; {html.escape(x.f)}</td><td>{x.start:.2f}</td>'
        f'<td>{"never ended" if x.end is None else f"{x.end:.2f}"}</td>'
        f"<td><code>{html.escape(_short(x.value))}</code></td></tr>" for x in t.faults)
    return f"<table><tr><th>fault</th><th>from (s)</th><th>to (s)</th><th>what the nemesis did</th></tr>{rows}</table>"


def _found_line(results: dict[str, Any]) -> str:
    """One line under the verdict: the anomaly types found, forbidden first, each linking to its section."""
    types = results.get("anomaly_types") or []
    bad = [t for t in types if t in set(results.get("bad_anomaly_types") or [])]
    allowed = [t for t in types if t not in bad]

    def links(kinds: list[str]) -> str:
        return ", ".join(f'<a href="#anomaly-{html.escape(k)}">{html.escape(k)}</a> '
                         f'({results.get("counts", {}).get(k, 0)})' for k in kinds)

    parts = ([f'<b class="forbidden">Forbidden by the model: {links(bad)}</b>'] if bad else []) + \
        ([f"Allowed by the model: {links(allowed)}"] if allowed else [])
    return f'<p id="found">{". ".join(parts)}.</p>' if parts else '<p id="found">No anomaly found.</p>'


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _witness_ops(results: dict[str, Any]) -> list[int]:
    return sorted({o for kind in results.get("anomaly_types") or []
                   for w in results.get("anomalies", {}).get(kind) or []
                   for o in (w.get("ops") or [])[:WITNESS_OPS] if isinstance(o, int)})


@dataclass
class Drawn:
    """What a report draws from the history alone: its timeline (None when it has none to draw),
    the fault colours, and the HTML of the plots over time (or of why there are none)."""
    timeline: Timeline | None
    colours: dict[str, str]
    plots: str


def _matplotlib() -> None:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "faultline", "font.family": "sans-serif"})


def _size_and_limit(history: Path) -> tuple[int, float]:
    """The history's size in bytes (0 when absent) and the largest drawn in memory, in MB; OSError
    when it cannot be read."""
    size = history.stat().st_size if history.exists() else 0
    return size, float(os.environ.get("FAULTLINE_REPORT_MAX_MB") or MAX_HISTORY_MB)


def needs_results(directory: Path) -> bool:
    """Whether drawing `directory`'s history needs its results first: one too large for memory is
    drawn from Spark's figures, which pick out the witness operations."""
    try:
        size, limit = _size_and_limit(Path(directory) / "history.jsonl")
    except OSError:
        return False
    return size > limit * 1e6


def draw(directory: Path, results: dict[str, Any] | None = None, spark=None) -> Drawn:
    """The plots over time of the store folder `directory`. They need only the history, so a check
    draws them while its analysis runs (checker.check), except for a history too large for memory
    (needs_results), drawn from Spark's figures with `results` and `spark`."""
    _matplotlib()
    directory = Path(directory).resolve()
    timeline, problem = None, None
    history = directory / "history.jsonl"
    try:
        size, limit = _size_and_limit(history)
        if size > limit * 1e6 and spark is not None:
            from ..history_analysis.spark_timeline import spark_timeline

            timeline = spark_timeline(spark, history, _witness_ops(results or {}))
        elif size > limit * 1e6:
            problem = (f"the history is {size / 1e6:.0f} MB, and without Spark the plots are drawn in memory for "
                       f"histories up to {limit:g} MB (about 280,000 operations); check it with the Spark engine, "
                       f"or set FAULTLINE_REPORT_MAX_MB to draw larger ones in memory, with about 8 GB of memory "
                       f"per 1,000 MB")
        elif history.exists():
            timeline = read_timeline(history)
    except OSError as exc:
        problem = f"the history could not be read for the plots: {exc}"
    colours = _fault_colour(timeline.faults) if timeline else {}
    if timeline is None:
        plots = f'<p class="note" id="no-plots">No plots: {html.escape(problem or "no history.jsonl in this folder")}.</p>'
    else:
        plots = "\n".join(["<h2>Over time</h2>", _latency_plot(timeline, colours), _quantile_plot(timeline, colours),
                           _throughput_plot(timeline, colours), _lag_plot(timeline, colours),
                           _unseen_plot(timeline, colours), "<h2>Faults</h2>", _faults_table(timeline, colours)])
    return Drawn(timeline, colours, plots)


def render(directory: Path, results: dict[str, Any], spark=None, drawn: Drawn | None = None) -> str:
    """The report of the store folder `directory` whose results are `results`, as HTML. With a
    Spark session, a history too large for memory is drawn from Spark's figures. `drawn`: its
    plots over time, already drawn (draw)."""
    directory = directory.resolve()
    _matplotlib()
    spec, spec_problem = {}, None
    if (directory / "test.json").exists():
        try:
            spec = json.loads((directory / "test.json").read_text())
            spec = spec if isinstance(spec, dict) else {}
        except (OSError, ValueError) as exc:
            spec_problem = f"test.json could not be read ({exc}): the run's settings are not shown"
    head, cls = VERDICTS.get(results.get("valid"), ("UNKNOWN", "unknown"))
    stats = results.get("stats") or {}
    if drawn is None:
        drawn = draw(directory, results, spark)
    timeline, colours = drawn.timeline, drawn.colours
    reasons = results.get("unknown_reasons") or ([results["error"]] if results.get("error") else [])
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{head} {html.escape(spec.get('name', directory.name))} {html.escape(directory.name)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f'<header><h1><span class="verdict {cls}" id="verdict">{head}</span> '
        f"{html.escape(spec.get('name', ''))} <small>{html.escape(directory.name)}</small></h1>",
        f"<p>Model <b>{html.escape(str(results.get('model')))}</b>; "
        f"{stats.get('ops', 0)} client operations: {stats.get('ok', 0)} ok, {stats.get('fail', 0)} fail, "
        f"{stats.get('info', 0)} info"
        + (f"; seed <b>{spec['seed']}</b>" if "seed" in spec else "")
        + (f"; {rate['achieved']:g} client operations/s in the main phase, of {rate['asked']:g} asked"
           if (rate := results.get("rate") or {}).get("achieved") is not None else "") + ".</p>",
        _found_line(results),
        "".join(f'<p class="note">unknown: {html.escape(r)}</p>' for r in reasons),
        "".join(f'<p class="note">note: {html.escape(n)}</p>'
                for n in (results.get("notes") or []) + ([spec_problem] if spec_problem else [])),
        (f"<p>Reproduce: <code id=\"repro\">faultline repro {html.escape(str(directory))}</code> "
         f"(same spec and seed: the same workload and fault schedule, timing aside)</p>" if spec else
         "" if spec_problem else
         "<p class=\"note\">No test.json beside the history: this history was not recorded by a faultline run.</p>"),
        _settings(spec) if spec else "", "</header>",
        drawn.plots,
        "<h2>Anomalies</h2>", _anomalies(results, timeline, colours), "<h2>Files</h2>", _files(directory),
        "</body></html>",
    ]
    return "\n".join(parts)


def write_report(directory: str | os.PathLike, results: dict[str, Any] | None = None, spark=None,
                 drawn: Drawn | None = None) -> Path | None:
    """Write `directory`/report.html; its results from results.json when not given; `spark`: a
    session for histories too large to draw in memory; `drawn`: its plots over time, when already
    drawn. A report that cannot be made is logged and skipped (None): it never changes the verdict
    or the exit status."""
    directory = Path(directory)
    try:
        if results is None:
            results = json.loads((directory / "results.json").read_text())
        text = render(directory, results, spark, drawn)
        path = directory / REPORT
        tmp = path.with_suffix(".html.tmp")
        tmp.write_text(text)
        tmp.replace(path)
        return path
    except Exception as exc:  # noqa: BLE001 - the report is a view of the verdict, never a reason to lose it
        # Where it failed in faultline's own code, so that the warning alone says what to mend.
        root = str(Path(__file__).resolve().parents[1])
        frames = traceback.extract_tb(exc.__traceback__)
        where = next((f for f in reversed(frames) if f.filename.startswith(root)
                      and "site-packages" not in f.filename), frames[-1])
        log.warning("could not write %s: %s: %s (at %s:%d, in %s)", directory / REPORT, type(exc).__name__, exc,
                    os.path.relpath(where.filename, root), where.lineno, where.name)
        log.debug("writing the report failed", exc_info=True)
        return None



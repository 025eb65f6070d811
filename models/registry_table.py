"""The anomaly registry as a Markdown table, for docs/anomalies.md.

In: nothing (models/anomaly_types.py and models/guarantees.py). Out: `markdown()`, one row per
registered type: what it means, the promises whose claim forbids it, whether each named model
forbids it, and the Jepsen function it follows (with faultline's difference, if any). Run as
`python -m faultline.models.registry_table` to print it; a test holds docs/anomalies.md to it.
"""

from __future__ import annotations

from .anomaly_types import JEPSEN, REGISTRY
from .guarantees import BASE_NAMES, model_named

MODELS = (*BASE_NAMES.values(), "exactly-once+write-isolation")
BEGIN = "<!-- registry table: python -m faultline.models.registry_table -->"
END = "<!-- end of registry table -->"


def markdown() -> str:
    models = [model_named(name) for name in MODELS]
    head = ["type", "what it means", "bad when the run claims"] + [f"`{m.name}`" for m in models] + ["Jepsen"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in REGISTRY:
        function, differs = JEPSEN[t.name]
        claims = " and ".join(f"`{p}`" for p in sorted(t.breaks)) or t.never_bad
        verdicts = ["bad" if m.forbids(t.name) else "allowed" for m in models]
        jepsen = f"`{function}`" + (f"; {differs}" if differs else "")
        lines.append("| " + " | ".join([f"`{t.name}`", t.description, claims, *verdicts, jepsen]) + " |")
    return "\n".join([BEGIN, *lines, END])


if __name__ == "__main__":
    print(markdown())

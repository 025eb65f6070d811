"""The store: where a run's files live.

In: a test spec. Out: `store/<test-name>/<timestamp>/` created with the spec
written to test.json, and the links `store/latest` and
`store/<test-name>/latest` pointing at it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ..models.spec import TestSpec


def create_run_dir(spec: TestSpec) -> Path:
    root = Path(spec.store)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime()) + f".{int(time.time() * 1000) % 1000:03d}"
    directory = root / spec.name / stamp
    directory.mkdir(parents=True, exist_ok=False)
    (directory / "test.json").write_text(json.dumps(spec.to_json(), indent=2) + "\n")
    for link, target in ((root / "latest", Path(spec.name) / stamp), (root / spec.name / "latest", Path(stamp))):
        tmp = link.with_name(link.name + ".tmp")
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        os.symlink(target, tmp)
        os.replace(tmp, link)
    return directory

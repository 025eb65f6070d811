"""The wheel, installed on its own, is the whole program.

The project's parts live at the repository root and are installed as `faultline.<part>`
(pyproject.toml, package-dir). This builds the wheel, installs it into a fresh virtual
environment and runs the `faultline` command there from a folder outside the repository,
so nothing can come from the source tree or from the project's editable install:

- the `faultline` package is the venv's own copy, and no part is importable by its bare
  folder name (`models`, `checker`);
- `faultline --help`, `faultline broker --help` and `faultline check --engine python` on a
  small valid history exit 0;
- every data file (non-.py) that git tracks in a part folder is in the wheel.

Offline and fast: the fresh venv gets the third-party dependencies from the project's
.venv, through a `.pth` file naming a folder of links to that .venv's site-packages entries,
minus everything of faultline's own (its dist-info, the editable install's
`__editable__*` finder and `.pth` files) and pip. A `.pth` line only appends its folder to
sys.path (the `.pth` files inside it are not processed), and with faultline's own
entries left out, pip resolves the wheel's declared dependencies against the linked ones
(`--no-index`: nothing is downloaded) and the only faultline it can find is the wheel's.
Building the wheel uses pip's isolated build, which needs setuptools (pyproject's
build-system.requires) from the package index or pip's cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PY = f"python{sys.version_info.major}.{sys.version_info.minor}"


def run(cmd: list, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def clean_env(venv: Path | None = None) -> dict:
    """The caller's environment without anything that points Python at other code."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONSAFEPATH")
           and not k.startswith("PIP_")}
    env.update(PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def git_files(*args: str) -> list[str]:
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", *args], capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def parts() -> dict[str, str]:
    """{folder: package}, from pyproject.toml's package-dir: models -> faultline.models, ..."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    package_dir = pyproject["tool"]["setuptools"]["package-dir"]
    assert package_dir and all(p.startswith("faultline.") for p in package_dir)
    return {folder: package for package, folder in package_dir.items()}


def source_snapshot(dest: Path) -> Path:
    """The working tree's files (tracked, and untracked ones git does not ignore) copied to `dest`.

    The wheel is built from this copy rather than in the repository: an in-tree setuptools
    build reuses the repository's build/lib, which keeps modules deleted or moved since an
    earlier build and puts them in the wheel, and concurrent builds would share it.
    """
    for rel in git_files("--cached", "--others", "--exclude-standard"):
        src = REPO / rel
        if src.is_file():  # tracked but deleted in the working tree: not part of it
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def dependency_links(dest: Path) -> Path:
    """A folder of links to the project .venv's site-packages entries, faultline's own and pip left out."""
    site = Path(sysconfig.get_paths()["purelib"])
    assert (site / "pip").is_dir(), f"run the tests with the project's .venv (sys.prefix {sys.prefix})"
    dest.mkdir()
    for entry in site.iterdir():
        name = entry.name.lower()
        if (name.startswith(("__editable__", "faultline", "pip-")) or name in ("pip", "__pycache__")
                or name.endswith(".pth")):
            continue
        (dest / entry.name).symlink_to(entry)
    return dest


def is_test_file(rel: str) -> bool:
    parts_ = Path(rel).parts
    return any(p in ("tests", "test") for p in parts_[:-1]) or parts_[-1].startswith(("test_", "conftest"))


@pytest.mark.slow
def test_wheel_installs_and_runs_without_the_source_tree(tmp_path):
    src = source_snapshot(tmp_path / "src")
    dist, work = tmp_path / "dist", tmp_path / "work"
    work.mkdir()

    # Build.
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", dist, src], work, clean_env(), 600)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dist.glob("faultline-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    # Every file a part folder holds is in the wheel at faultline/<part>/...: the modules
    # (which shows the mapping below is right), and the data files the program needs.
    folders = parts()
    tracked = [rel for rel in git_files("--", *folders) if (REPO / rel).is_file() and not is_test_file(rel)]

    def in_wheel(rel: str) -> str:
        folder, _, rest = rel.partition("/")
        return folders[folder].replace(".", "/") + "/" + rest

    modules = [rel for rel in tracked if rel.endswith(".py")]
    assert len(modules) > 20 and {"checker/check.py", "runner/cli.py", "models/history.py"} <= set(modules)
    assert [rel for rel in modules if in_wheel(rel) not in names] == []
    data = [rel for rel in tracked if not rel.endswith(".py")]
    missing = [rel for rel in data if in_wheel(rel) not in names]
    assert missing == [], f"data files missing from the wheel (declare them as package data): {missing}"
    # Nothing outside the namespace: no bare `models/...`, no tests.
    assert {n.split("/")[0] for n in names} == {"faultline", "-".join(wheel.name.split("-")[:2]) + ".dist-info"}
    assert not any(is_test_file(n) for n in names)

    # Install into a fresh venv, the dependencies linked from the project's .venv.
    venv = tmp_path / "venv"
    made = run([sys.executable, "-m", "venv", "--without-pip", venv], work, clean_env())
    assert made.returncode == 0, made.stdout + made.stderr
    python = venv / "bin" / "python"
    venv_site = venv / "lib" / PY / "site-packages"
    assert venv_site.is_dir()
    deps = dependency_links(tmp_path / "deps")
    (venv_site / "zz-faultline-test-deps.pth").write_text(f"{deps}\n")
    installed = run([sys.executable, "-m", "pip", "--python", python, "install", "--no-index", wheel],
                    work, clean_env(venv))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    # pip resolved the declared dependencies against the linked ones; the wheel's faultline it installed.
    assert "Successfully installed faultline-" in installed.stdout, installed.stdout
    env = clean_env(venv)

    # Where everything comes from, inside the venv.
    probe = run([python, "-c", """if True:
        import importlib.metadata, json, sys
        import faultline, faultline.checker.check, faultline.history_analysis.reference, faultline.runner.cli
        import kio
        print(json.dumps({
            "faultline_path": list(faultline.__path__),
            "files": [m.__file__ for m in (faultline.checker.check, faultline.history_analysis.reference,
                                           faultline.runner.cli)],
            "dist": str(importlib.metadata.distribution("faultline").locate_file("")),
            "editable": [m for m in sys.modules if "editable" in m]
                        + [repr(f) for f in sys.meta_path if "editable" in repr(f).lower()],
            "kio": kio.__file__,
            "sys_path": sys.path,
        }))
        """], work, env)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    where = json.loads(probe.stdout)
    assert where["faultline_path"] == [str(venv_site / "faultline")]
    for f in where["files"]:
        assert Path(f).is_relative_to(venv_site / "faultline") and not Path(f).is_relative_to(REPO), f
    assert Path(where["dist"]) == venv_site
    assert where["editable"] == []
    assert Path(where["kio"]).is_relative_to(deps)
    assert str(REPO) not in where["sys_path"] and str(src) not in where["sys_path"]

    # No part is importable by its bare name.
    for bare in ("models", "checker"):
        imported = run([python, "-c", f"import {bare}"], work, env)
        assert imported.returncode == 1, (bare, imported.stdout, imported.stderr)
        assert f"ModuleNotFoundError: No module named '{bare}'" in imported.stderr

    # The command line.
    faultline = venv / "bin" / "faultline"
    assert faultline.read_text().startswith(f"#!{python}")
    helped = run([faultline, "--help"], work, env)
    assert helped.returncode == 0, helped.stdout + helped.stderr
    assert "check" in helped.stdout and "broker" in helped.stdout
    broker_help = run([faultline, "broker", "--help"], work, env)
    assert broker_help.returncode == 0, broker_help.stdout + broker_help.stderr
    assert "--data-dir" in broker_help.stdout

    history = work / "run" / "history.jsonl"
    history.parent.mkdir()
    history.write_text("".join(json.dumps(line) + "\n" for line in [
        {"index": 0, "time": 10, "process": 0, "type": "invoke", "f": "send",
         "mops": [{"f": "send", "key": "t/0", "value": 1}]},
        {"index": 1, "time": 20, "process": 0, "type": "ok", "f": "send",
         "mops": [{"f": "send", "key": "t/0", "value": 1, "offset": 0}]},
        {"index": 2, "time": 30, "process": 1, "type": "invoke", "f": "assign", "keys": ["t/0"],
         "seek_to_beginning": True},
        {"index": 3, "time": 40, "process": 1, "type": "ok", "f": "assign", "keys": ["t/0"],
         "seek_to_beginning": True},
        {"index": 4, "time": 50, "process": 1, "type": "invoke", "f": "poll", "mops": [{"f": "poll"}]},
        {"index": 5, "time": 60, "process": 1, "type": "ok", "f": "poll",
         "mops": [{"f": "poll", "records": [{"key": "t/0", "offset": 0, "value": 1}]}]},
    ]))
    checked = run([faultline, "check", "--engine", "python", "--no-progress", history], work, env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    results = json.loads((history.parent / "results.json").read_text())
    assert results["valid"] is True, results

"""`faultline serve`: a small web server over the store, to browse runs.

In: the store folder (`store/<test-name>/<timestamp>/`, runner.store) and an address. Out: an
HTTP server whose index (`/`) is a table of the runs (name, time, verdict, anomaly types, seed;
newest first; `?verdict=valid|invalid|unknown` filters), each linking to its report.html and its
folder; every other path is a file or folder inside the store. A path that leads outside the
store (`..`, or a link pointing out) is refused with 403, whatever its spelling.
"""

from __future__ import annotations

import html
import json
import mimetypes
import os
import posixpath
import shutil
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

from ..checker.report import REPORT

VERDICTS = {True: "valid", False: "invalid", "unknown": "unknown"}
TEXT = {".jsonl", ".log", ".cfg", ".properties", ".txt", ".xml"}


@dataclass(frozen=True)
class Run:
    path: str  # relative to the store, with "/"
    name: str
    stamp: str
    verdict: str
    anomaly_types: list[str]
    bad: list[str]
    seed: int | None


def runs(store: Path) -> list[Run]:
    """Every run folder of the store (one holding test.json or history.jsonl), newest first."""
    out = []
    for test in sorted(p for p in store.iterdir() if p.is_dir() and not p.is_symlink()):
        for folder in (p for p in test.iterdir() if p.is_dir() and not p.is_symlink()):
            if not ((folder / "test.json").exists() or (folder / "history.jsonl").exists()):
                continue
            results, spec = _json(folder / "results.json"), _json(folder / "test.json")
            out.append(Run(f"{test.name}/{folder.name}", test.name, folder.name,
                           VERDICTS.get(results.get("valid"), "not checked") if results else "not checked",
                           results.get("anomaly_types") or [], results.get("bad_anomaly_types") or [],
                           spec.get("seed")))
    return sorted(out, key=lambda r: (r.stamp, r.name), reverse=True)


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def index_page(store: Path, verdict: str | None) -> str:
    shown = [r for r in runs(store) if verdict in (None, "", r.verdict)]
    filters = " · ".join(f'<a href="/?verdict={v}">{v}</a>' for v in ("valid", "invalid", "unknown")) + \
        ' · <a href="/">all</a>'
    rows = []
    for r in shown:
        link = quote(r.path)
        report = (f'<a href="/{link}/{REPORT}">report</a>' if (store / r.path / REPORT).exists() else "no report")
        types = ", ".join(f"<b>{html.escape(t)}</b>" if t in r.bad else html.escape(t) for t in r.anomaly_types)
        rows.append(f'<tr class="{r.verdict.replace(" ", "-")}"><td>{html.escape(r.name)}</td>'
                    f'<td><a href="/{link}/">{html.escape(r.stamp)}</a></td><td>{html.escape(r.verdict)}</td>'
                    f"<td>{types}</td><td>{'' if r.seed is None else r.seed}</td><td>{report}</td></tr>")
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>faultline runs</title><style>'
        "body{font:14px/1.45 system-ui,sans-serif;margin:24px}table{border-collapse:collapse}"
        "th,td{text-align:left;padding:3px 14px 3px 0}tr.invalid td:nth-child(3){color:#c0392b;font-weight:600}"
        "tr.valid td:nth-child(3){color:#2e8b57}tr.unknown td:nth-child(3){color:#7f8c8d}</style></head><body>"
        f"<h1>faultline runs</h1><p>{len(shown)} run(s) in {html.escape(str(store))}"
        f"{' with verdict ' + html.escape(verdict) if verdict else ''}. Show: {filters}</p>"
        "<table id=\"runs\"><tr><th>test</th><th>time</th><th>verdict</th><th>anomaly types (forbidden in bold)"
        "</th><th>seed</th><th></th></tr>" + "".join(rows) + "</table></body></html>")


def resolve(store: Path, url_path: str) -> Path | None:
    """The file or folder of the store that `url_path` names, or None when it would lie outside."""
    parts = unquote(url_path).split("/")
    if any(p in ("..", ".") or "\\" in p or "\0" in p for p in parts):
        return None
    target = (store / posixpath.normpath("/" + "/".join(parts)).lstrip("/")).resolve()
    root = store.resolve()
    return target if target == root or root in target.parents else None


def _listing(folder: Path, url_path: str) -> str:
    items = sorted(folder.iterdir(), key=lambda p: (not p.is_dir(), p.name))
    base = url_path if url_path.endswith("/") else url_path + "/"
    rows = "".join(f'<li><a href="{quote(base + p.name)}{"/" if p.is_dir() else ""}">{html.escape(p.name)}'
                   f'{"/" if p.is_dir() else ""}</a></li>' for p in items)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(url_path)}</title>'
            f'</head><body style="font:14px system-ui,sans-serif;margin:24px"><p><a href="/">all runs</a></p>'
            f"<h1>{html.escape(url_path)}</h1><ul>{rows}</ul></body></html>")


def handler(store: Path):
    class Handler(BaseHTTPRequestHandler):
        server_version = "faultline"

        def log_message(self, format, *args):  # noqa: A002 - the base class's name
            pass

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self):  # noqa: N802 - the base class's name
            self.do_GET()

        def do_GET(self):  # noqa: N802 - the base class's name
            url = urlsplit(self.path)
            if url.path == "/favicon.ico":
                # Browsers ask for one; there is none, and a 404 would be an error in their console.
                self.send_response(HTTPStatus.NO_CONTENT)
                return self.end_headers()
            if url.path == "/":
                verdict = (parse_qs(url.query).get("verdict") or [None])[0]
                return self._send(200, index_page(store, verdict).encode(), "text/html; charset=utf-8")
            target = resolve(store, url.path)
            if target is None:
                return self._send(HTTPStatus.FORBIDDEN, b"outside the store\n", "text/plain; charset=utf-8")
            if target.is_dir():
                if not url.path.endswith("/"):
                    self.send_response(HTTPStatus.MOVED_PERMANENTLY)
                    self.send_header("Location", url.path + "/")
                    self.send_header("Content-Length", "0")
                    return self.end_headers()
                return self._send(200, _listing(target, url.path).encode(), "text/html; charset=utf-8")
            if not target.is_file():
                return self._send(HTTPStatus.NOT_FOUND, b"no such file in the store\n", "text/plain; charset=utf-8")
            kind = ("text/plain; charset=utf-8" if target.suffix in TEXT
                    else mimetypes.guess_type(target.name)[0] or "application/octet-stream")
            if kind == "text/html":
                kind += "; charset=utf-8"
            # Streamed: a history can be larger than the server's memory.
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(target.stat().st_size))
            self.end_headers()
            if self.command != "HEAD":
                with open(target, "rb") as f:
                    shutil.copyfileobj(f, self.wfile)

    return Handler


def make_server(store: str | os.PathLike, host: str = "127.0.0.1", port: int = 8080) -> ThreadingHTTPServer:
    """A server over `store` (not yet serving: call serve_forever)."""
    store = Path(store)
    if not store.is_dir():
        raise FileNotFoundError(f"no store folder at {store}: give the folder runs are stored in (--store; "
                                f"`faultline run` stores them in ./store by default)")
    server = ThreadingHTTPServer((host, port), handler(store))
    server.daemon_threads = True
    return server

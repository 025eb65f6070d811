"""Pages loaded in real headless Chromium (Debian's `chromium`, driven through Playwright), as a
person would open them: what the console said, which requests left, which elements are there,
and a screenshot kept as a test artefact (test-artifacts/, or FAULTLINE_TEST_ARTIFACTS)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("FAULTLINE_TEST_ARTIFACTS") or REPO / "test-artifacts")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@dataclass
class Loaded:
    console: list[tuple[str, str]]  # (type, text) of every console message
    errors: list[str]  # uncaught page errors
    requests: list[str]  # every URL the page asked for, its own included
    counts: dict[str, int]  # CSS selector -> how many elements match
    texts: dict[str, str]  # CSS selector (of text_of) -> the first match's text
    screenshot: Path


def chromium() -> str:
    path = shutil.which("chromium")
    assert path, "Debian's chromium is not installed: scripts/setup installs it"
    return path


def load(url: str, screenshot: str, selectors: list[str], text_of: tuple[str, ...] = ()) -> Loaded:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / screenshot
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            console, errors, requests = [], [], []
            page.on("console", lambda m: console.append((m.type, m.text)))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(url, wait_until="load")
            counts = {s: page.locator(s).count() for s in selectors}
            texts = {s: page.locator(s).first.inner_text() for s in text_of if page.locator(s).count()}
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    return Loaded(console, errors, requests, counts, texts, shot)

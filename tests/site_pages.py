"""Every page of the built documentation site opened in headless Chromium (playwright):
the console errors, uncaught exceptions and failed requests of each, and one screenshot
of the home page. ``python -m tests.site_pages SITE [OUT]`` (``make docs-check``) prints
them and exits 1 if any page had one.

Chromium is ``$CHROMIUM`` if set, else playwright's own (``python -m playwright install
chromium``), else the system's (``chromium``, ``chromium-browser``, ``google-chrome``)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from typing import Any

SYSTEM_BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def pages(site: str) -> list[str]:
    """The HTML pages of a built site, as paths under it (the home page first)."""
    found = sorted(os.path.relpath(os.path.join(folder, name), site)
                   for folder, _, names in os.walk(site) for name in names
                   if name.endswith(".html") and "assets" not in folder.split(os.sep))
    return sorted(found, key=lambda page: page != "index.html")


def chromium(playwright_chromium: Any) -> str | None:
    """The Chromium to launch: a path, or None for playwright's own."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    if os.path.exists(playwright_chromium.executable_path):
        return None
    for name in SYSTEM_BROWSERS:
        if shutil.which(name):
            return shutil.which(name)
    raise FileNotFoundError("no Chromium: run `python -m playwright install chromium`, "
                            "or set CHROMIUM to a Chromium or Chrome executable")


@contextlib.contextmanager
def serving(site: str) -> Iterator[str]:
    """The site served over HTTP on a free local port (the search's web worker and fetches
    do not run from file:// pages): its base URL."""
    handler = functools.partial(_QuietHandler, directory=site)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base's name)
        pass


def check(site: str, out: str) -> dict[str, list[str]]:
    """Open every page of ``site``: page -> its problems (console errors, uncaught
    exceptions, failed requests, HTTP errors). A screenshot of the home page, after the
    search box was used, goes to ``out``/home.png."""
    from playwright.sync_api import sync_playwright

    problems: dict[str, list[str]] = {}
    os.makedirs(out, exist_ok=True)
    with serving(site) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(p.chromium), headless=True)
        try:
            for page_path in pages(site):
                found = problems.setdefault(page_path, [])
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.on("console", lambda m, f=found: f.append(f"console {m.type}: {m.text}")
                        if m.type == "error" else None)
                page.on("pageerror", lambda e, f=found: f.append(f"uncaught: {e}"))
                page.on("requestfailed", lambda r, f=found: f.append(f"request failed: {r.url} ({r.failure})"))
                page.on("response", lambda r, f=found: f.append(f"HTTP {r.status}: {r.url}")
                        if r.status >= 400 else None)
                page.goto(base + page_path, wait_until="networkidle")
                if page_path == "index.html":
                    page.fill("input[name=query]", "resume")  # the search's worker runs
                    page.wait_for_timeout(800)
                    page.keyboard.press("Escape")
                    page.screenshot(path=os.path.join(out, "home.png"))
                page.close()
        finally:
            browser.close()
    return problems


def main(argv: list[str]) -> int:
    site = argv[0] if argv else "site"
    out = argv[1] if len(argv) > 1 else "site-check"
    problems = check(site, out)
    bad = {page: found for page, found in problems.items() if found}
    for page, found in bad.items():
        for problem in found:
            print(f"{page}: {problem}")
    print(f"{len(problems)} pages opened in headless Chromium, {len(bad)} with errors; "
          f"screenshot: {os.path.join(out, 'home.png')}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

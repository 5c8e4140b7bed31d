"""The documentation site: its plots are drawn from the figures docs/benchmarks.md records
(bench/plots.py), and, built with ``mkdocs build --strict``, every page renders in headless
Chromium without a console error (tests/site_pages.py). No Spark."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from bench import plots
from tests.conftest import REPO_ROOT

BENCHMARKS = os.path.join(REPO_ROOT, "docs", "benchmarks.md")


def test_the_plots_are_drawn_from_the_recorded_figures(tmp_path):
    """Each plot of bench/plots.py is shown in docs/benchmarks.md and committed in
    docs/img/; drawn from a copy whose transform figure is changed, the scoring plot
    changes (it is the table's figures that are drawn, not a picture kept)."""
    with open(BENCHMARKS, encoding="utf-8") as f:
        text = f.read()
    for name in plots.PLOTS:
        assert plots.image_line(name) in text, f"docs/benchmarks.md does not show {name}"
        assert os.path.exists(os.path.join(REPO_ROOT, "docs", "img", name)), name
    scoring = plots.section_table(text, plots.SCORING)
    methods = {row["method"] for row in scoring}
    assert {m for m, _, _ in plots.METHODS} <= methods, methods
    memory = plots.section_table(text, plots.MEMORY)
    assert {row["mode"] for row in memory} == {"copy per worker", "shared file"}

    drawn = plots.render(BENCHMARKS, str(tmp_path / "a"))
    assert sorted(os.path.basename(p) for p in drawn) == sorted(plots.PLOTS)
    for path in drawn:  # the committed plots are those of the recorded figures
        with open(os.path.join(REPO_ROOT, "docs", "img", os.path.basename(path)), "rb") as f:
            assert f.read() == open(path, "rb").read(), f"{path}: run python -m bench.plots"
    changed = tmp_path / "benchmarks.md"
    line = next(line for line in text.splitlines() if re.search(r"\|\s+BroadcastModel\.transform \|", line))
    cells = line.split("|")
    cells[-3] = " 0.10 "  # its x ceiling
    changed.write_text(text.replace(line, "|".join(cells)))
    plots.render(str(changed), str(tmp_path / "b"))
    png = "scoring-vs-ceiling.png"
    assert (tmp_path / "a" / png).read_bytes() != (tmp_path / "b" / png).read_bytes()
    assert (tmp_path / "a" / "memory-per-executor.png").read_bytes() == \
        (tmp_path / "b" / "memory-per-executor.png").read_bytes()


def test_a_section_without_its_table_is_named():
    with pytest.raises(ValueError, match="no section '## Nowhere'"):
        plots.section_table("# Benchmarks\n", "## Nowhere")
    with pytest.raises(ValueError, match="no table in the section"):
        plots.section_table(f"{plots.MEMORY}\n\nnothing measured\n", plots.MEMORY)


def test_the_readme_stays_short_and_links_into_the_site():
    with open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert len(readme.splitlines()) < 300
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert os.path.exists(os.path.join(REPO_ROOT, target)), f"README links to {target}, missing"


@pytest.mark.slow  # the site built, 20 pages opened: about a minute
def test_every_page_renders_in_headless_chromium_without_console_errors(tmp_path):
    """The site built with --strict; every page opened in headless Chromium (playwright)
    logs no console error, throws nothing and fetches nothing that fails; a page planted
    with an error is reported (the check sees errors)."""
    pytest.importorskip("mkdocs", reason="the docs extra: make docs installs it")
    pytest.importorskip("playwright", reason="the docs extra: make docs installs it")
    from playwright.sync_api import sync_playwright

    from tests import site_pages

    with sync_playwright() as p:
        try:
            site_pages.chromium(p.chromium)
        except FileNotFoundError as e:
            pytest.skip(str(e))
    site = tmp_path / "site"
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert built.returncode == 0, built.stderr[-3000:]
    (site / "planted").mkdir()
    (site / "planted" / "index.html").write_text(
        "<html><body><script>console.error('planted error'); no_such_name();</script></body></html>")
    problems = site_pages.check(str(site), str(tmp_path / "shots"))
    planted = problems.pop(os.path.join("planted", "index.html"))
    assert any("planted error" in p for p in planted) and any("no_such_name" in p for p in planted), planted
    assert len(problems) >= 20 and "index.html" in problems and "api/index.html" in problems
    assert {page: found for page, found in problems.items() if found} == {}
    assert (tmp_path / "shots" / "home.png").stat().st_size > 10_000

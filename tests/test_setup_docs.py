"""The set-up the pages give (issue 55 item 9): after ``make demo`` the commands it
installed are in ``.venv/bin``, not on PATH: each page that shows ``make demo`` says to
``source .venv/bin/activate`` (or call them from ``.venv/bin``), and they are there. No
Spark."""

from __future__ import annotations

import os
import sys

import pytest

from tests.conftest import REPO_ROOT

PAGES = ["README.md", os.path.join("docs", "index.md"), os.path.join("docs", "getting-started.md")]


@pytest.mark.parametrize("page", PAGES)
def test_a_page_with_make_demo_says_how_to_reach_its_commands(page):
    with open(os.path.join(REPO_ROOT, page), encoding="utf-8") as f:
        text = f.read()
    demo = text.index("make demo")
    said = text.find("source .venv/bin/activate", demo)
    assert 0 < said - demo < 1500, f"{page}: no `source .venv/bin/activate` after make demo"
    assert ".venv/bin/spark-keras" in text[demo:said + 200], page


def test_the_venv_holds_the_commands_the_pages_name():
    folder = os.path.dirname(sys.executable)  # the venv's bin, as make demo builds it
    for command in ("spark-keras", "spark-submit"):
        assert os.access(os.path.join(folder, command), os.X_OK), command

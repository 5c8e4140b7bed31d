"""compat/matrix.py's verdict on a leg: only a pytest run in which tests passed is a PASS."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from tests.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def matrix():
    spec = importlib.util.spec_from_file_location(
        "compat_matrix", os.path.join(REPO_ROOT, "compat", "matrix.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


LEGS = {
    "passed and skipped": ("import pytest\n"
                           "def test_ok(): pass\n"
                           "def test_skip(): pytest.skip('no pyspark')\n", True, "PASS 1 passed, 1 skipped"),
    "all skipped": ("import pytest\n"
                    "pytestmark = pytest.mark.skip(reason='no pyspark')\n"
                    "def test_a(): pass\n"
                    "def test_b(): pass\n", False, "SKIPPED 2 skipped"),
    "no tests": ("def helper(): pass\n", False, "NO TESTS no tests ran"),
    "a failure": ("def test_ok(): pass\n"
                  "def test_bad(): assert False\n", False, "FAIL 1 failed, 1 passed"),
    "collection error": ("import no_such_module_here\n"
                         "def test_a(): pass\n", False, "FAIL 1 error"),
}


@pytest.mark.parametrize("case", LEGS)
def test_leg_verdict_from_a_real_pytest_run(matrix, tmp_path, case):
    source, ok, result = LEGS[case]
    (tmp_path / "test_leg.py").write_text(source)
    returncode, lines = matrix.run_pytest(sys.executable, [str(tmp_path / "test_leg.py")],
                                          dict(os.environ))
    assert matrix.leg_result(returncode, lines)[0] is ok
    assert matrix.leg_result(returncode, lines)[1].startswith(result), lines[-3:]


def test_leg_verdict_without_a_summary_or_with_a_failing_status(matrix):
    crashed = ["tests/test_x.py ..", "Fatal Python error: Segmentation fault"]
    assert matrix.leg_result(-11, crashed) == (False, "FAIL (exit status -11, no pytest summary)")
    # every test passed but pytest still failed (an error at exit, say): not a PASS
    ok, result = matrix.leg_result(1, ["3 passed in 70.02s (0:01:10)\n"])
    assert not ok and result == "FAIL 3 passed in 70.02s (0:01:10)"
    ok, result = matrix.leg_result(0, ["===== 3 passed, 2 warnings in 70.02s (0:01:10) =====\n"])
    assert ok and result == "PASS 3 passed, 2 warnings in 70.02s (0:01:10)"

"""The suite's own reporting guards (tests/conftest.py, issue 55): a failure pytest cannot format
is still reported with its exception, and tests a crashed worker never ran are named and fail
the run. CI once lost a failure's message and 1 176 tests that never ran to a worker that
crashed while formatting one failure (CPython 3.11's "AST constructor recursion depth
mismatch"). Each case runs a real pytest in a subprocess with the suite's conftest as a plugin.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str) -> pytest.RunResult:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the subprocess imports tests.conftest
    return pytester.runpytest_subprocess("-p", "tests.conftest", "-p", "no:cacheprovider", *args)


def test_a_failure_whose_formatting_fails_is_reported_with_its_exception(pytester, monkeypatch):
    pytester.makeconftest(
        """
        import pytest

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_makereport(item, call):
            if call.excinfo is not None:  # as CPython 3.11's ast did inside pytest's formatting
                raise SystemError("AST constructor recursion depth mismatch (before=147, after=68)")
        """
    )
    pytester.makepyfile(
        """
        def test_fails():
            raise ValueError("the failure's own message")

        def test_after():
            pass
        """
    )
    result = run(pytester, monkeypatch)
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*ValueError: the failure's own message*"])
    result.stdout.fnmatch_lines(["*pytest could not format this failure*SystemError*"])
    assert "INTERNALERROR" not in result.stdout.str()


@pytest.mark.skipif(sys.platform != "linux", reason="os._exit in a pytest-xdist worker")
def test_tests_a_crashed_worker_never_ran_are_named_and_fail_the_run(pytester, monkeypatch):
    pytester.makepyfile(
        test_crash="""
        import os

        def test_a():
            pass

        def test_crashes():
            os._exit(3)

        def test_never_runs_1():
            pass

        def test_never_runs_2():
            pass
        """
    )
    result = run(pytester, monkeypatch, "-n", "1", "--max-worker-restart=0")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*tests did not run*"])
    result.stdout.fnmatch_lines(["*test_crash.py::test_never_runs_2*"])

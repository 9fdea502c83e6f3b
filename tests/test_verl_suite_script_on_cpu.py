"""``scripts/verl_suite.py`` (verl's own CPU tests with and without verl-mopd): its outcome reading, its
comparison, and the venv in which verl-mopd is not installed. The full run needs a verl clone and minutes per
condition (docs/reliability.md)."""

import runpy
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITE = runpy.run_path(str(ROOT / "scripts" / "verl_suite.py"), run_name="verl_suite")

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.a_on_cpu" name="test_ok" />
<testcase classname="tests.a_on_cpu" name="test_skip"><skipped message="no vllm" /></testcase>
<testcase classname="tests.a_on_cpu" name="test_fail"><failure message="assert 1 == 2" /></testcase>
<testcase classname="tests.a_on_cpu" name="test_teardown"><error message="teardown" /></testcase>
<testcase classname="tests.a_on_cpu" name="test_teardown" />
</testsuite></testsuites>"""


def test_outcomes_reads_each_test_and_keeps_its_worst_report(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    assert SUITE["outcomes"](path) == {"tests.a_on_cpu::test_ok": "passed", "tests.a_on_cpu::test_skip": "skipped",
                                       "tests.a_on_cpu::test_fail": "failed", "tests.a_on_cpu::test_teardown": "error"}


def test_differences_names_every_test_whose_outcome_differs_and_a_missing_one():
    runs = {"with": {"t1": "passed", "t2": "failed", "t3": "passed"},
            "nodist": {"t1": "passed", "t2": "passed"}}
    assert SUITE["differences"](runs) == [("t2", {"with": "failed", "nodist": "passed"}),
                                          ("t3", {"with": "passed", "nodist": "absent"})]
    assert SUITE["differences"]({"with": {"t1": "failed"}, "nodist": {"t1": "failed"}}) == []


def test_the_pin_has_a_commit_and_another_version_is_refused_by_name(monkeypatch):
    import importlib.metadata

    commit, why = SUITE["verl_commit"](None)
    assert len(commit) == 40 and importlib.metadata.version("verl") in why
    monkeypatch.setitem(SUITE["verl_commit"].__globals__, "PIN_COMMITS", {})
    with pytest.raises(SystemExit, match=r"installed verl 0\.9\.1: no commit known for it"):
        SUITE["verl_commit"](None)


def test_the_nodist_venv_has_verl_but_not_verl_mopd_nor_its_entry_point(tmp_path):
    python = SUITE["nodist_python"](tmp_path)
    probe = subprocess.run([str(python), "-c", "import importlib.util as u, importlib.metadata as m; "
                            "print(u.find_spec('verl') is not None, u.find_spec('verl_mopd') is None, "
                            "m.entry_points(group='verl.plugins') == ())"],
                           capture_output=True, text=True, check=True, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert probe.stdout.split() == ["True", "True", "True"], probe.stderr

"""The demo's progress line (a fake clock) and its Ctrl-C exit (a real demo process sent SIGINT)."""

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from verl_mopd.demo.config import DemoConfig
from verl_mopd.demo.progress import Progress, ProgressLine, stage_plan

ROOT = Path(__file__).resolve().parents[2]


def test_the_plan_has_every_stage_of_every_seed():
    cfg = DemoConfig(seeds=3)
    plan = stage_plan(cfg, [0, 1, 2])
    assert [k for k in plan if k[0] == "base"] == [("base", "teacher"), ("base", "student")]
    assert {k[1] for k in plan if k[0] == 1} == {"teachers", "mopd", "evals", "grpo", "baselines"}
    assert len(plan) == 2 + 3 * 5 and all(v > 0 for v in plan.values())
    assert len(stage_plan(DemoConfig(baselines=False), [0], bases=())) == 3


def test_eta_uses_the_measured_seconds_of_each_stage_and_the_measured_concurrency():
    plan = {("base", "student"): 10.0, (0, "a"): 10.0, (0, "b"): 30.0, (1, "a"): 10.0, (1, "b"): 30.0}
    p = Progress(plan, start=100.0)
    assert p.eta(101.0) is None and "ETA --" in p.line(101.0)
    p.done(("base", "student"), 0.0, 101.0)  # a reused base: no time, no rate yet
    assert p.eta(101.0) is None
    p.done((0, "a"), 4.0, 105.0)  # 4 s for 10 units: 0.4 s/unit where nothing of a stage is known
    assert p.remaining_work() == pytest.approx(4.0 + 12.0 + 12.0)  # (1, a) as measured; b: 30 units x 0.4
    assert p.eta(105.0) == pytest.approx(28.0)  # concurrency 4 s of work in 5 s wall: 1 (never below 1)
    p.done((1, "a"), 4.0, 105.0)  # two workers: 8 s of work in 5 s
    assert p.eta(105.0) == pytest.approx(24.0 / 1.6)
    p.done((0, "b"), 20.0, 125.0)
    assert p.remaining_work() == pytest.approx(20.0)  # stage b as measured now
    assert p.fraction == pytest.approx(60 / 90)
    p.done((1, "b"), 20.0, 125.0)
    assert p.line(125.0).startswith("[stage 5/5] 100% · 25s elapsed · done")
    with pytest.raises(KeyError, match=r"stage \(2, 'a'\) is not in the plan"):
        p.done((2, "a"), 1.0, 126.0)


def test_off_a_terminal_each_finished_stage_is_one_plain_line_under_whole_log_lines():
    out = io.StringIO()
    line = ProgressLine(Progress({(0, "a"): 1.0, (0, "b"): 1.0}, start=0.0), out, tty=False)
    line.log("row 1")
    line.stage_done((0, "a"), 2.0, 2.0)
    line.log("row 2")
    line.stage_done((0, "b"), 2.0, 4.0)
    line.close()
    assert out.getvalue().splitlines() == [
        "row 1", "[stage 1/2]  50% · 2s elapsed · ETA 2s · seed 0: a done", "row 2",
        "[stage 2/2] 100% · 4s elapsed · done · seed 0: b done"]
    assert "\r" not in out.getvalue()


def test_on_a_terminal_the_line_is_redrawn_below_the_log():
    out = io.StringIO()
    line = ProgressLine(Progress({(0, "a"): 1.0, (0, "b"): 1.0}, start=0.0), out, tty=True)
    line.stage_done((0, "a"), 2.0, 2.0)
    line.log("row")
    line.close()
    text = out.getvalue()
    shown = "[stage 1/2]  50% · 2s elapsed · ETA 2s · seed 0: a done"
    assert text == shown + "\r" + " " * len(shown) + "\r" + "row\n" + shown + "\n"  # cleared, logged, drawn again


def test_ctrl_c_exits_130_with_one_line_no_traceback_and_no_complete_looking_run(tmp_path):
    """SIGINT to the whole process group, as a terminal sends it, while two seed workers train."""
    (tmp_path / "summary.json").write_text("{}")  # a finished run's marker in the same folder: kept
    argv = [sys.executable, "-m", "verl_mopd.cli", "demo", "--seeds=2", "--steps=500", "--teacher-base-steps=2",
            "--base-steps=2", "--sft-desktop=8", "--sft-mobile=4", "--teacher-steps=1", "--prompts-per-step=4",
            "--rollout-n=2", "--sft-batch=8", "--eval-tasks=4", "--max-new-tokens=26", "--no-plot",
            f"--out={tmp_path}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                            start_new_session=True,  # its own process group, as a terminal's foreground job
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a background shell ignores it
    try:
        seen = []
        for text in proc.stdout:
            seen.append(text)
            if "teachers done" in text:  # the seed workers are in stage 2 now
                break
        assert any("teachers done" in s for s in seen), "".join(seen)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    beside = tmp_path.with_name(tmp_path.name + ".2")  # the finished run's folder is never written into
    assert seen[0].startswith(f"verl-mopd demo: {tmp_path} holds a finished run (summary.json); it is kept as it "
                              f"is, and this run writes to {beside}"), seen[0]
    assert err.splitlines() == [f"verl-mopd demo: interrupted; {beside} has no summary.json, the mark of a "
                                "complete run"], err
    assert (tmp_path / "summary.json").read_text() == "{}" and not (beside / "summary.json").exists()

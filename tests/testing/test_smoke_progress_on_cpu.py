"""``verl-mopd smoke`` is never silent for long: each running phase prints what it is doing, the steps
done and, from the last passed run on this machine, about how long it has left."""

import json
import sys

import pytest

from verl_mopd.testing import smoke


def test_a_progress_line_names_the_last_milestone_and_the_steps_done(tmp_path):
    log, metrics = tmp_path / "stage2.log", tmp_path / "metrics.jsonl"
    assert smoke.progress_line("stage2", 3.2, log) == "stage2: 3 s, starting"  # no log yet
    log.write_text("INFO worker.py -- Started a local Ray instance.\n(TaskRunner) actor and ref model engine "
                   "initialized\n")
    assert smoke.progress_line("stage2", 40, log, metrics, 3) == "stage2: 40 s, starting the rollout"
    metrics.write_text(json.dumps({"step": 1, "data": {}}) + "\n")
    assert smoke.progress_line("stage2", 70, log, metrics, 3, expected=200) == "stage2: 70 s, step 1/3 done, ~130 s left"
    with log.open("a") as f:
        f.write("(TaskRunner) Saving checkpoint to /x/global_step_2\n")
    metrics.write_text(metrics.read_text() + json.dumps({"step": 2, "data": {}}) + "\n{\"ste")  # a line being written
    line = smoke.progress_line("stage2_resume", 250, log, metrics, 3, expected=200)
    assert line == "stage2_resume: 250 s, saving a checkpoint, longer than the last run here (200 s)"
    metrics.write_text(json.dumps({"step": 3, "data": {}}) + "\n")  # a resumed run logs from step 3
    assert smoke.progress_line("stage2_resume", 90, log, metrics, 3).endswith("saving a checkpoint; step 3/3 done")


def test_a_running_process_prints_progress_and_a_finished_one_stops(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(smoke, "PROGRESS_EVERY", 0.2)
    calls = []
    smoke.run_process([sys.executable, "-c", "import time; time.sleep(1.6)"], {}, tmp_path / "p.log", 60, tmp_path,
                      progress=lambda elapsed: calls.append(elapsed) or f"sleeping: {elapsed:.0f} s")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[smoke]   sleeping")]
    assert len(lines) >= 2 and len(calls) == len(lines)
    assert calls == sorted(calls) and calls[-1] < 1.7 + 1.0  # printed while it ran, not after


def test_a_process_past_its_timeout_is_killed_and_named(tmp_path):
    with pytest.raises(smoke.PhaseFailed, match="timed out after 1 s"):
        smoke.run_process([sys.executable, "-c", "import time; time.sleep(30)"], {}, tmp_path / "p.log", 1, tmp_path)


def test_the_phase_headers_say_what_the_last_passed_run_here_took(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VERL_MOPD_CACHE", str(tmp_path / "cache"))
    first = smoke.PhaseLog(tmp_path / "a.json", "cpu")
    assert first.expected("stage2") is None
    with first.phase("stage2"):
        pass
    assert "[smoke] stage2 ...\n" in capsys.readouterr().out  # nothing known yet
    first.records[0]["seconds"] = 214.9
    first.passed()
    second = smoke.PhaseLog(tmp_path / "b.json", "cpu")
    assert second.expected("stage2") == 214.9
    with second.phase("stage2"):
        pass
    assert "[smoke] stage2 ... (last run here: 215 s)" in capsys.readouterr().out
    assert smoke.PhaseLog(tmp_path / "c.json", "cpu-fsdp").expected("stage2") is None  # per profile

"""The CPU demo: synthetic tasks, tokenizer, and a shortened end-to-end run of both stages."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_mopd.demo.cli import main
from verl_mopd.demo.models import build_tokenizer
from verl_mopd.demo.run import METRIC_FIELDS, DemoConfig, run
from verl_mopd.demo.tasks import INTENTS, make_task, make_tasks
from verl_mopd.rewards import compute_score

TINY = dict(steps=2, teacher_steps=3, base_steps=2, prompts_per_step=4, rollout_n=2, sft_batch=8, eval_tasks=8,
            max_new_tokens=26, log_every=1)


def test_tasks_are_seeded_and_balanced():
    a, b = make_tasks(20, seed=3), make_tasks(20, seed=3)
    assert a == b and a != make_tasks(20, seed=4)
    assert [t.platform for t in a] == ["desktop", "mobile"] * 10
    assert {t.intent for t in make_tasks(400, seed=0)} == set(INTENTS)
    with pytest.raises(ValueError, match="platform='tablet'"):
        make_task("tablet", np.random.default_rng(0))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_targets_score_correct_and_the_other_platforms_convention_does_not(seed):
    tok = build_tokenizer()
    rng = np.random.default_rng(seed)
    desk, mob = make_task("desktop", rng), make_task("mobile", np.random.default_rng(seed))
    assert desk.prompt.split(" ", 1)[1] == mob.prompt.split(" ", 1)[1]  # same screen and instruction
    for task, other in ((desk, mob), (mob, desk)):
        ids = tok(task.target)["input_ids"]
        assert tok.unk_token_id not in ids and tok.unk_token_id not in tok(task.prompt)["input_ids"]
        decoded = tok.decode(ids)  # what the policy's text looks like: tokens joined by spaces
        assert compute_score("demo", decoded, task.ground_truth)["score"] == 1.0
        if task.intent in ("click", "back", "scroll"):  # the conflicting conventions
            assert task.ground_truth["action"]["action"] != other.ground_truth["action"]["action"]
        assert compute_score("demo", other.target, task.ground_truth)["score"] < 1.0


def _check_run(summary, out, cfg, runs):
    n_rollouts = cfg.steps * cfg.prompts_per_step * cfg.rollout_n
    assert set(summary["stage_s"]) >= {"stage1", "stage2"}
    for p in ("desktop", "mobile"):
        assert (out / "teachers" / p / "config.json").exists()
        assert p in summary["eval"][f"teacher:{p}"] and p in summary["eval"]["MOPD student"]
    # each teacher scored exactly its platform's rollouts, every one of them
    half = n_rollouts // 2
    assert summary["teacher_queries"] == {"desktop": {"desktop": half, "mobile": 0},
                                          "mobile": {"desktop": 0, "mobile": half}}
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["run"], r["step"]) for r in lines] == [(run, s + 1) for run in runs for s in range(cfg.steps)]
    for r in lines:
        assert set(METRIC_FIELDS) <= set(r), set(METRIC_FIELDS) - set(r)
        for p in ("desktop", "mobile"):
            assert -1.0 <= r[f"reward/{p}"] <= 1.0
        if r["run"] == "mopd":
            assert all(math.isfinite(r[f"k3/{p}"]) and r[f"k3/{p}"] >= 0 for p in ("desktop", "mobile"))
            assert 0.0 <= r["mask_on_fraction"] <= 1.0
            assert r["teacher_samples/desktop"] == r["teacher_samples/mobile"] == cfg.prompts_per_step * cfg.rollout_n / 2
        else:  # no teacher for the no-KL baseline
            assert r["teacher_samples/desktop"] == 0 and math.isnan(r["k3/desktop"])


def test_short_demo_through_the_cli_local_teachers(tmp_path, capsys):
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()] + ["--teachers=local", f"--out={tmp_path}"]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    _check_run(summary, tmp_path, DemoConfig(**TINY), runs=("mopd", "grpo"))
    assert {"mixed SFT", "GRPO, no KL", "teacher weight avg", "student base"} <= set(summary["eval"])
    assert (tmp_path / "demo.png").stat().st_size > 1000
    printed = capsys.readouterr()
    assert "| MOPD student |" in printed.out + printed.err and "mask on" in printed.out + printed.err


def test_short_demo_with_the_ray_teacher_group(tmp_path):
    cfg = DemoConfig(**TINY, teachers="ray", baselines=False, plot=False, out=str(tmp_path))
    summary = run(cfg)
    _check_run(summary, tmp_path, cfg, runs=("mopd",))


def test_default_generation_budget_fits_every_target():
    tok = build_tokenizer()
    longest = max(len(tok(t.target)["input_ids"]) for t in make_tasks(400, seed=0))
    assert longest + 1 <= DemoConfig().max_new_tokens  # + <eos>: a cut-off swipe would score invalid


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="demo.rollout_n=1"):
        DemoConfig(rollout_n=1)
    with pytest.raises(ValueError, match="demo.teachers='gpu'"):
        DemoConfig(teachers="gpu")
    with pytest.raises(ValueError, match="demo.teacher_size='huge'"):
        DemoConfig(teacher_size="huge")

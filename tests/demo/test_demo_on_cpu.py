"""The CPU demo: synthetic tasks, tokenizer, seed statistics, the gradient-norm ratio, and a
shortened multi-seed end-to-end run of both stages and every baseline."""

import argparse
import copy
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from commands import demo as main
from verl_mopd.demo.models import build_model, build_tokenizer
from verl_mopd.demo.config import BASELINES, METRIC_FIELDS, MODELS, DemoConfig
from verl_mopd.demo.report import aggregate, per_seed_table, seesaw, windows
from verl_mopd.demo.run import run
from verl_mopd.demo.stages import Policy, TeacherScorer, pretrain_base, rl_step, sft
from verl_mopd.demo.tasks import CELL_CENTERS, HALF_CELL, INTENTS, make_task, make_tasks, mobile_frame, sample_tasks
from verl_mopd.errors import UsageError
from verl_mopd.rewards import compute_score

TINY = dict(seeds=2, steps=2, teacher_base_steps=2, base_steps=2, sft_desktop=8, sft_mobile=4, teacher_steps=1,
            prompts_per_step=4, rollout_n=2, sft_batch=8, eval_tasks=4, max_new_tokens=26, log_every=1, base_val_tasks=2)


def test_tasks_are_seeded_balanced_and_skip_excluded_prompts():
    a, b = make_tasks(20, seed=3), make_tasks(20, seed=3)
    assert a == b and a != make_tasks(20, seed=4)
    assert [t.platform for t in a] == ["desktop", "mobile"] * 10
    assert {t.intent for t in make_tasks(400, seed=0)} == set(INTENTS)
    skip = {t.prompt for t in a[:5]}
    again = make_tasks(20, seed=3, exclude=skip)
    assert len(again) == 20 and not skip & {t.prompt for t in again}
    mix = sample_tasks(2000, seed=1, mobile_share=0.1)
    assert 0.07 < np.mean([t.platform == "mobile" for t in mix]) < 0.13
    assert {t.platform for t in sample_tasks(50, seed=1, mobile_share=0.0)} == {"desktop"}
    with pytest.raises(ValueError, match="platform='tablet'"):
        make_task("tablet", np.random.default_rng(0))
    with pytest.raises(ValueError, match="mobile_share=1.5"):
        sample_tasks(3, seed=0, mobile_share=1.5)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_targets_score_correct_and_the_other_platforms_convention_does_not(seed):
    tok = build_tokenizer()
    desk, mob = make_task("desktop", np.random.default_rng(seed)), make_task("mobile", np.random.default_rng(seed))
    assert desk.prompt.split(" ", 1)[1] == mob.prompt.split(" ", 1)[1]  # same screen and instruction
    for task, other in ((desk, mob), (mob, desk)):
        ids = tok(task.target)["input_ids"]
        assert tok.unk_token_id not in ids and tok.unk_token_id not in tok(task.prompt)["input_ids"]
        decoded = tok.decode(ids)  # what the policy's text looks like: tokens joined by spaces
        assert compute_score("demo", decoded, task.ground_truth)["score"] == 1.0
        if task.intent in ("click", "back", "scroll"):  # the conflicting conventions
            assert task.ground_truth["action"]["action"] != other.ground_truth["action"]["action"]
        assert compute_score("demo", other.target, task.ground_truth)["score"] < 1.0
    if desk.intent == "click":  # the focused (first-listed) element, in each platform's frame
        _, x, y = desk.prompt.split(" | ")[1].split()
        assert desk.ground_truth["action"]["coordinate"] == [int(x), int(y)]
        assert mob.ground_truth["action"]["coordinate"] == list(mobile_frame(int(x), int(y)))


def test_click_boxes_never_overlap_after_the_strict_bbox_scale():
    """Every point the strict reward accepts for one cell (box scaled by 1.2) misses every other
    cell, in both platforms' frames, so no constant click scores on two cells."""
    r = HALF_CELL * 1.2
    cells = [(x, y) for x in CELL_CENTERS for y in CELL_CENTERS]
    assert {mobile_frame(x, y) for x, y in cells} == set(cells) and all(mobile_frame(*c) != c for c in cells)
    for platform, name in (("desktop", "left_click"), ("mobile", "click")):
        for cx, cy in cells:
            box = [cx - HALF_CELL, cy - HALF_CELL, cx + HALF_CELL, cy + HALF_CELL]
            edge = [(cx + dx, cy + dy) for dx in (-r, 0, r) for dy in (-r, 0, r)]
            for ox, oy in cells:
                truth = {"platform": platform, "action": {"action": name, "coordinate": [ox, oy]},
                         "bbox": [ox - HALF_CELL, oy - HALF_CELL, ox + HALF_CELL, oy + HALF_CELL]}
                for px, py in edge:
                    call = json.dumps({"name": "computer_use" if platform == "desktop" else "mobile_use",
                                       "arguments": {"action": name, "coordinate": [px, py]}})
                    got = compute_score("demo", f"<tool_call>{call}</tool_call>", truth)["score"]
                    assert (got == 1.0) == ((ox, oy) == (cx, cy)), (platform, box, (px, py), (ox, oy), got)


def _fake_seed(seed, acc):
    return {"seed": seed, "eval": {m: {p: {"acc": acc[m][p], "reward": 2 * acc[m][p] - 1} for p in ("desktop", "mobile")}
                                   for m in acc}}


def test_aggregate_mean_standard_error_and_paired_verdicts():
    rng = np.random.default_rng(0)
    runs = [{m: {"desktop": float(rng.uniform(0.3, 0.6)), "mobile": float(rng.uniform(0.3, 0.6))} for m in MODELS}
            for _ in range(3)]
    for i, r in enumerate(runs):  # MOPD: clearly above GRPO on desktop, identical to mixed SFT on mobile
        r["MOPD student"]["desktop"] = r["GRPO, no KL"]["desktop"] + 0.2 + 0.01 * i
        r["MOPD student"]["mobile"] = r["mixed SFT"]["mobile"]
        r["TIES"]["desktop"] = r["MOPD student"]["desktop"] + [0.3, 0.25, 0.35][i]
    agg = aggregate([_fake_seed(i, r) for i, r in enumerate(runs)])
    assert agg["n_seeds"] == 3 and list(agg["table"]) == list(MODELS) and list(agg["diffs"]) == list(BASELINES)
    for m in MODELS:
        for p in ("desktop", "mobile"):
            v = [r[m][p] for r in runs]
            mean, se = agg["table"][m][p]["acc"]
            assert math.isclose(mean, statistics.fmean(v), abs_tol=1e-12)
            assert math.isclose(se, statistics.stdev(v) / math.sqrt(3), abs_tol=1e-12)
    assert agg["diffs"]["GRPO, no KL"]["desktop"]["verdict"] == "above"
    assert agg["diffs"]["mixed SFT"]["mobile"] == {"mean": 0.0, "se": 0.0, "verdict": "tie"}
    assert agg["diffs"]["TIES"]["desktop"]["verdict"] == "below"
    d = agg["diffs"]["student base"]["mobile"]
    assert d["verdict"] == ("above" if d["mean"] > 2 * d["se"] else "below" if d["mean"] < -2 * d["se"] else "tie")


def test_windows_of_consecutive_seeds_and_the_per_seed_table():
    """Each window of 3 consecutive seeds holds iff MOPD is above every verdict baseline on both platforms."""
    rng = np.random.default_rng(1)
    runs = []
    for i in range(5):
        r = {m: {p: float(rng.uniform(0.3, 0.5)) for p in ("desktop", "mobile")} for m in MODELS}
        r["MOPD student"] = {"desktop": 0.9 + 0.01 * i, "mobile": 0.8 + 0.01 * (i % 2)}
        runs.append(r)
    runs[3]["TIES"]["mobile"] = 0.95  # seed 13: TIES above MOPD on mobile
    per_seed = [_fake_seed(10 + i, r) for i, r in enumerate(runs)]
    wins = windows(per_seed)
    assert [w["seeds"] for w in wins] == [[10, 11, 12], [11, 12, 13], [12, 13, 14]]
    assert [w["holds"] for w in wins] == [True, False, False]
    assert wins[0]["failed"] == [] and all(f.startswith("TIES mobile ") and f.endswith("(tie)") for f in wins[1]["failed"])
    assert len(wins[1]["failed"]) == 1
    # the window's verdicts are aggregate()'s over exactly those seeds
    d = aggregate(per_seed[1:4])["diffs"]["TIES"]["mobile"]
    assert f"{d['mean']:+.3f} ± {d['se']:.3f}" in wins[1]["failed"][0]
    assert windows(per_seed[:2]) == [] and len(windows(per_seed, n=5)) == 1
    with pytest.raises(ValueError, match="n=1"):
        windows(per_seed, n=1)
    table = per_seed_table(per_seed).splitlines()
    assert table[0] == ("| seed | MOPD acc | MOPD − GRPO, no KL | MOPD − weight average | MOPD − TIES | "
                        "MOPD − mixed SFT |") and len(table) == 2 + 5
    e = runs[3]
    assert table[5].startswith(f"| 13 | {e['MOPD student']['desktop']:.3f} / {e['MOPD student']['mobile']:.3f} | ")
    assert table[5].split(" | ")[4] == (f"{e['MOPD student']['desktop'] - e['TIES']['desktop']:+.3f} / "
                                        f"{e['MOPD student']['mobile'] - 0.95:+.3f}")


def test_seesaw_pairs_mixed_sft_with_each_single_platform_model_on_its_own_platform():
    """Mixed SFT minus ``desktop SFT`` / ``teacher:desktop`` on desktop and the mobile ones on mobile, per seed."""
    rng = np.random.default_rng(2)
    runs = [{m: {p: float(rng.uniform(0.3, 0.6)) for p in ("desktop", "mobile")} for m in MODELS} for _ in range(4)]
    for i, r in enumerate(runs):  # below the mobile SFT on mobile by 0.1-0.13, above the desktop SFT on desktop
        r["mobile SFT"]["mobile"] = r["mixed SFT"]["mobile"] + 0.1 + 0.01 * i
        r["desktop SFT"]["desktop"] = r["mixed SFT"]["desktop"] - 0.2 + 0.01 * i
        r["desktop SFT"]["mobile"] = 0.0  # the other platform plays no part
    line = seesaw([_fake_seed(i, r) for i, r in enumerate(runs)])
    assert line.startswith("Mixed SFT minus, paired over 4 seeds: desktop SFT on desktop +0.185 ± 0.006 (above); ")
    cells = line.removesuffix(".").split(": ", 1)[1].split("; ")
    assert [c.rsplit(" ", 4)[0] for c in cells] == ["desktop SFT on desktop", "teacher:desktop on desktop",
                                                    "mobile SFT on mobile", "teacher:mobile on mobile"]
    assert cells[2] == "mobile SFT on mobile -0.115 ± 0.006 (below)"
    d = [r["mixed SFT"]["desktop"] - r["teacher:desktop"]["desktop"] for r in runs]
    assert cells[1].split(" on desktop ")[1].startswith(f"{statistics.fmean(d):+.3f} ± "
                                                       f"{statistics.stdev(d) / math.sqrt(4):.3f}")


def test_grad_ratio_is_beta_times_the_k3_over_the_pg_gradient_norm(tmp_path):
    """``grad_ratio`` = |g_total - g_PG| / |g_PG| from one real MOPD step: linear in beta (same
    rollouts by common random numbers), and 0 at beta 0 where distillation_ppo_loss = ppo_loss."""
    tok = build_tokenizer()
    policy = Policy(build_model(tok, "tiny", seed=0), tok)
    sft(policy, (make_tasks(32, seed=s) for s in range(25)), 5e-3)  # enough to emit varied, partly valid calls
    paths = {}
    for i, p in enumerate(("desktop", "mobile")):
        teacher = build_model(tok, "tiny", seed=10 + i)
        paths[p] = str(tmp_path / p)
        teacher.save_pretrained(paths[p])
        tok.save_pretrained(paths[p])
    scorer = TeacherScorer(paths, "local")
    tasks = make_tasks(8, seed=5)
    ratios = {}
    for beta in (0.0, 0.2, 0.4):
        cfg = DemoConfig(beta=beta, rollout_n=4, prompts_per_step=8, max_new_tokens=32, tau_kl=1.0)
        model = Policy(copy.deepcopy(policy.model), tok)
        m = rl_step(model, torch.optim.AdamW(model.model.parameters(), lr=1e-3), tasks, cfg, scorer, rng_seed=7)
        ratios[beta] = m["grad_ratio"]
    assert all(r == r for r in ratios.values()), ratios  # some group had reward variance
    assert ratios[0.0] < 1e-5 * ratios[0.2]
    assert math.isclose(ratios[0.4], 2 * ratios[0.2], rel_tol=1e-4)


def _check_outputs(summary, out, cfg, runs):
    seeds = list(range(cfg.seed, cfg.seed + cfg.seeds))
    assert [s["seed"] for s in summary["per_seed"]] == seeds
    n_rollouts = cfg.steps * cfg.prompts_per_step * cfg.rollout_n
    for s in summary["per_seed"]:
        assert {"teachers", "mopd", "evals"} <= set(s["stage_s"]) and s["cpu_s"] > 0
        assert s["sft_sizes"] == {"desktop": cfg.sft_desktop, "mobile": cfg.sft_mobile}
        # mixed SFT on the stage-1 budget: as many SFT steps as the two teachers together (unless set)
        # and each single-platform SFT of the student base as many as its platform's teacher
        assert s["sft_steps"] == ({"teacher:desktop": cfg.teacher_steps, "teacher:mobile": cfg.teacher_steps}
                                  | ({"mixed SFT": cfg.mixed_sft_steps or 2 * cfg.teacher_steps,
                                      "desktop SFT": cfg.teacher_steps, "mobile SFT": cfg.teacher_steps}
                                     if cfg.baselines else {}))
        students = out / f"seed{s['seed']}" / "students"  # the trained RL students, kept for a look
        assert (students / "mopd" / "config.json").exists()
        assert (students / "grpo" / "config.json").exists() == ("grpo" in runs)
        for p in ("desktop", "mobile"):
            assert (out / f"seed{s['seed']}" / "teachers" / p / "config.json").exists()
            assert (out / f"seed{s['seed']}" / "sft" / p / "config.json").exists() == cfg.baselines
        expected = [m for m in MODELS if cfg.baselines or m not in BASELINES or m == "student base"]
        assert list(s["eval"]) == [m for m in ["teacher:desktop", "teacher:mobile", "teacher base", "MOPD student",
                                               "student base", "GRPO, no KL", "mixed SFT", "desktop SFT", "mobile SFT",
                                               "weight average", "TIES"]
                                   if m in expected]
        for e in s["eval"].values():
            for p in ("desktop", "mobile"):
                assert 0.0 <= e[p]["acc"] <= 1.0 and -1.0 <= e[p]["reward"] <= 1.0
                assert set(e[p]["intents"]) <= set(INTENTS)
        # each teacher scored exactly its platform's rollouts, every one of them
        half = n_rollouts // 2
        assert s["teacher_queries"] == {"desktop": {"desktop": half, "mobile": 0}, "mobile": {"desktop": 0, "mobile": half}}
    for role in ("teacher", "student"):
        assert (out / "bases" / role / "pretrain.json").exists()
    assert summary["aggregate"]["n_seeds"] == cfg.seeds
    assert list(summary["aggregate"]["table"]) == [m for m in MODELS if m in summary["per_seed"][0]["eval"]]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sorted((r["run"], r["seed"], r["step"]) for r in lines) == sorted(
        (run_, s, step + 1) for run_ in runs for s in seeds for step in range(cfg.steps))
    for r in lines:
        assert set(METRIC_FIELDS) <= set(r), set(METRIC_FIELDS) - set(r)
        for p in ("desktop", "mobile"):
            assert -1.0 <= r[f"reward/{p}"] <= 1.0
        if r["run"] == "mopd":
            assert all(math.isfinite(r[f"k3/{p}"]) and r[f"k3/{p}"] >= 0 for p in ("desktop", "mobile"))
            assert 0.0 <= r["mask_on_fraction"] <= 1.0
            assert r["teacher_samples/desktop"] == r["teacher_samples/mobile"] == cfg.prompts_per_step * cfg.rollout_n / 2
            assert r["grad_ratio"] != r["grad_ratio"] or r["grad_ratio"] >= 0
        else:  # no teacher for the no-KL baseline
            assert r["teacher_samples/desktop"] == 0 and math.isnan(r["k3/desktop"]) and math.isnan(r["grad_ratio"])


def test_short_multi_seed_demo_through_the_cli(tmp_path, capfd):
    """Two seeds in two spawned processes (local teachers), every baseline; a second run reuses the bases."""
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()] + [f"--out={tmp_path}"]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    _check_outputs(summary, tmp_path, DemoConfig(**TINY), runs=("mopd", "grpo"))
    assert list(summary["aggregate"]["diffs"]) == list(BASELINES)
    assert summary["wall_s"] > 0 and summary["cpu_s"] > 0
    assert (tmp_path / "demo.png").stat().st_size > 1000
    printed = capfd.readouterr().out
    assert "| MOPD student |" in printed and "| MOPD acc minus |" in printed and "grad ratio" in printed
    assert "reusing" not in printed
    # one progress line per finished stage (not a terminal), the last one done; no worker's stray output
    stages = [s for s in printed.splitlines() if s.startswith("[stage ")]
    assert len(stages) == 2 + 2 * 5 and stages[-1].startswith("[stage 12/12] 100%") and " · done · " in stages[-1]
    assert all(s.startswith(("[stage ", "seed ", "stage 0", "mopd ", "grpo ", "|", "verl-mopd demo", "run ", "beta=",
                             "W", "")) or not s for s in printed.splitlines())
    # a rerun into the finished run's folder keeps it whole and writes beside it, reusing its bases
    finished = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert main(argv + ["--seeds=1", "--no-baselines", "--no-plot"]) == 0
    again = capfd.readouterr().out
    beside = tmp_path.with_name(tmp_path.name + ".2")
    assert again.splitlines()[0] == (f"verl-mopd demo: {tmp_path} holds a finished run (summary.json); it is kept "
                                     f"as it is, and this run writes to {beside} (reusing the bases of {tmp_path / 'bases'})")
    assert printed.count("stage 0") == 2 and again.count("reusing") == 3  # the note and both bases
    assert {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == finished
    summary2 = json.loads((beside / "summary.json").read_text())
    assert summary2["config"]["out"] == str(beside) and [s["seed"] for s in summary2["per_seed"]] == [0]
    assert (beside / "seed0" / "students" / "mopd" / "config.json").exists() and not (beside / "bases").exists()
    # a knob that differs never retrains over the cache: refused before any work, the cache untouched
    stamp = (tmp_path / "bases" / "student" / "pretrain.json").read_text()
    changed = DemoConfig(**TINY | {"base_steps": DemoConfig(**TINY).base_steps + 1}, out=str(tmp_path))
    with pytest.raises(UsageError, match=r"cached student base .* other knobs \(base_steps/teacher_base_steps: "):
        pretrain_base(changed, "student")
    assert (tmp_path / "bases" / "student" / "pretrain.json").read_text() == stamp
    assert not list((tmp_path / "bases").glob(".*partial*"))  # the save went through a renamed folder


def test_bases_stop_at_the_first_check_that_reaches_their_target(tmp_path, monkeypatch):
    """Competence, not a step count: the base is the fixed-step base of the step it first reaches the target."""
    from transformers import AutoModelForCausalLM

    from verl_mopd.demo import stages

    seen = []

    def scripted(accs):
        it = iter(accs)

        def val_acc(policy, tasks, max_new_tokens):
            seen.append(len(tasks))
            return next(it)
        return val_acc

    knobs = TINY | {"base_steps": 20, "base_acc": 0.5, "base_check_every": 2, "base_val_tasks": 3}
    monkeypatch.setattr(stages, "_val_acc", scripted([0.1, 0.4, 0.3, 0.6, 0.9]))
    lines = []
    path = Path(pretrain_base(DemoConfig(**knobs, out=str(tmp_path / "a")), "student", log=lines.append))
    record = json.loads((path / "pretrain.json").read_text())
    assert (record["stopped_at"], record["reached"]) == (8, True)
    assert record["val_acc"] == [[2, 0.1], [4, 0.4], [6, 0.3], [8, 0.6]] and seen == [6] * 4  # 3 per platform
    assert "8 steps, validation acc 0.600 >= its target 0.5" in lines[-1]
    fixed = Path(pretrain_base(DemoConfig(**TINY | {"base_steps": 8, "base_acc": 0.0}, out=str(tmp_path / "b")), "student"))
    assert json.loads((fixed / "pretrain.json").read_text())["val_acc"] == []  # target 0: no check
    a, b = (AutoModelForCausalLM.from_pretrained(str(p)).state_dict() for p in (path, fixed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # never reached: the step count is the cap, and the log says so
    monkeypatch.setattr(stages, "_val_acc", scripted([0.1] * 3))
    knobs |= {"base_steps": 5}
    path = Path(pretrain_base(DemoConfig(**knobs, out=str(tmp_path / "c")), "student", log=lines.append))
    record = json.loads((path / "pretrain.json").read_text())
    assert (record["stopped_at"], record["reached"], record["val_acc"]) == (5, False, [[2, 0.1], [4, 0.1], [5, 0.1]])
    assert "validation acc 0.100 < its target 0.5 at the cap of 5" in lines[-1]
    # the target is part of the cache's stamp: another target never reuses (or overwrites) this base
    with pytest.raises(UsageError, match=r"base_acc/teacher_base_acc: 0.5 there, 0.6 now"):
        pretrain_base(DemoConfig(**knobs | {"base_acc": 0.6}, out=str(tmp_path / "c")), "student")


def test_base_validation_set_is_fresh_balanced_and_disjoint_from_the_eval_set():
    from verl_mopd.demo.stages import base_val_set, eval_set

    cfg = DemoConfig(base_val_tasks=40, eval_tasks=64)
    val = base_val_set(cfg)
    assert len(val) == 80 and [t.platform for t in val] == ["desktop", "mobile"] * 40
    assert not {t.prompt for t in val} & {t.prompt for t in eval_set(64)}
    assert val != base_val_set(DemoConfig(base_val_tasks=40, eval_tasks=64, base_seed=1))


def test_short_demo_with_the_ray_teacher_group(tmp_path):
    cfg = DemoConfig(**TINY | {"seeds": 1}, teachers="ray", baselines=False, plot=False, out=str(tmp_path))
    _check_outputs(run(cfg), tmp_path, cfg, runs=("mopd",))


def test_default_generation_budget_fits_every_target():
    tok = build_tokenizer()
    longest = max(len(tok(t.target)["input_ids"]) for t in make_tasks(400, seed=0))
    assert longest + 1 <= DemoConfig().max_new_tokens  # + <eos>: a cut-off swipe would score invalid


def test_mixed_sft_budget_is_the_stage1_budget_unless_set():
    from verl_mopd.demo.cli import add_demo_arguments

    assert DemoConfig(teacher_steps=7).mixed_steps == 14  # as many SFT steps as the two teachers together
    args = add_demo_arguments(argparse.ArgumentParser()).parse_args(["--mixed-sft-steps=250", "--teacher-steps=7"])
    assert DemoConfig(**vars(args)).mixed_steps == 250


def test_every_model_size_is_a_cli_choice_and_builds_smaller_to_larger():
    from verl_mopd.demo.cli import add_demo_arguments
    from verl_mopd.demo.config import SIZES

    parser = add_demo_arguments(argparse.ArgumentParser())
    tok = build_tokenizer()
    weights = []
    for size in SIZES:
        args = parser.parse_args([f"--size={size}", f"--teacher-size={size}"])
        assert DemoConfig(**vars(args)).size == size
        weights.append(sum(p.numel() for p in build_model(tok, size, seed=0).parameters()))
    assert weights == sorted(weights) and len(set(weights)) == len(weights), dict(zip(SIZES, weights))
    with pytest.raises(SystemExit):
        parser.parse_args(["--size=huge"])


def test_bad_config_names_the_field():
    for kwargs, match in ((dict(rollout_n=1), "demo.rollout_n=1"), (dict(teachers="gpu"), "demo.teachers='gpu'"),
                          (dict(teacher_size="huge"), "demo.teacher_size='huge'"), (dict(seeds=0), "demo.seeds=0"),
                          (dict(beta=-1.0), "demo.beta=-1.0"), (dict(rl_lr=0.0), "demo.rl_lr=0.0"),
                          (dict(pretrain_mobile_share=2.0), "demo.pretrain_mobile_share=2.0"),
                          (dict(mixed_sft_steps=-1), "demo.mixed_sft_steps=-1"),
                          (dict(base_acc=1.5), "demo.base_acc=1.5"), (dict(base_check_every=0), "demo.base_check_every=0"),
                          (dict(teachers="ray", workers=3), "demo.workers=3 with teachers='ray'"),
                          (dict(gate_metric="score"), "demo.gate_metric='score': allowed 'acc', 'rm_scores'")):
        with pytest.raises(ValueError, match=match.replace("(", r"\(")):
            DemoConfig(**kwargs)


def _run_cli(*argv: str, cwd: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-X", "importtime", "-m", "verl_mopd.cli", "demo", *argv], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_argument_mistakes_are_one_line_before_torch_is_imported(tmp_path):
    """A bad knob or an --out that is a file: exit 2, one line naming it, and neither torch nor verl imported."""
    (tmp_path / "README.md").write_text("mine\n")
    for argv, message in ((["--out=README.md"], "--out=README.md: is a file, not a folder"),
                          (["--rollout-n=1"], "demo.rollout_n=1: GRPO needs >= 2 rollouts per prompt"),
                          (["--gate-metric=score"], "demo.gate_metric='score': allowed 'acc', 'rm_scores'")):
        proc = _run_cli(*argv, cwd=tmp_path)
        _, err = proc.communicate(timeout=120)
        lines = [line for line in err.splitlines() if not line.startswith("import time:")]
        imported = {line.split("|")[-1].strip().split(".")[0] for line in err.splitlines()
                    if line.startswith("import time:")}
        assert proc.returncode == 2 and len(lines) == 1, lines
        assert lines[0].startswith(f"verl-mopd demo: error: {message}"), lines
        assert not imported & {"torch", "verl", "transformers"}, sorted(imported & {"torch", "verl", "transformers"})
    assert (tmp_path / "README.md").read_text() == "mine\n"


def _spawned_workers(pid: int) -> list[int]:
    """The multiprocessing spawn workers among ``pid``'s children (not the resource tracker)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(int(child))
            except OSError:
                pass
    return found


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads the process tree from /proc (Linux)")
def test_ctrl_c_while_the_workers_start_is_one_line(tmp_path):
    """Ctrl-C (SIGINT to the terminal's process group) while the seed workers are still importing torch:
    exit 130 and exactly the one line, no worker traceback (the review saw one 1 time in 4)."""
    out = tmp_path / "run"
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()] + [f"--out={out}", "--no-plot"]
    proc = subprocess.Popen([sys.executable, "-m", "verl_mopd.cli", "demo", *argv], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,  # its own process group, as a terminal's foreground job
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a background shell ignores it
    try:
        deadline = time.monotonic() + 300
        while not (workers := _spawned_workers(proc.pid)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        # the cause, checked directly: a new worker ignores SIGINT from its first instruction, before its
        # initializer (which runs only once torch is imported) could say so
        status = Path(f"/proc/{workers[0]}/status").read_text()
        ignored = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
        assert ignored >> (signal.SIGINT - 1) & 1, status
        time.sleep(0.5)  # the workers are importing (torch takes seconds)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert err.splitlines() == [f"verl-mopd demo: interrupted; {out} has no summary.json, the mark of a complete run"]

"""Both UI-MOPD stages through verl's own trainers on CPU: ``verl-mopd smoke``, checked, in CI.

The suite's end-to-end runs, on tiny Qwen3-VL models with screenshots: verl's SFT trainer twice
(stage 1), then ``python -m verl_mopd.trainer.main`` on the stage-2 recipe for two steps, a restart,
and a third step from the checkpoint. Once on the recipes' own layouts (verl's Megatron engine: SFT at
TP 2, the student at TP 2, both teachers on the ``megatron`` backend, colocated), once on verl's FSDP
engine with ``hf`` teachers, which users run too (``--no-resume``: its three steps in one process; the
restart is the Megatron run's). Then the smoke's checks are shown to fail on runs tampered with in the
ways they guard against.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verl_mopd.losses import K3_CLAMP_BELOW, K3_LINEAR_ABOVE
from verl_mopd.testing import smoke

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The warmed student's cache of this module's runs: the first run warms up, the second reuses it."""
    return tmp_path_factory.mktemp("cache")


def _smoke(tmp_path_factory, cache, *args):
    out = tmp_path_factory.mktemp("smoke") / "run"
    result = subprocess.run([sys.executable, "-m", "verl_mopd.cli", "smoke", "--out", str(out), *args],
                            capture_output=True, text=True, timeout=3600, check=False,
                            env={**os.environ, "VERL_MOPD_CACHE": str(cache)})
    return out, result


@pytest.fixture(scope="module")
def run(tmp_path_factory, cache):
    return _smoke(tmp_path_factory, cache)


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory, cache, run):  # after the Megatron run: its warmed student is reused
    return _smoke(tmp_path_factory, cache, "--engine", "fsdp", "--no-resume")


def _passed(out, result, resumed=True) -> dict:
    assert result.returncode == 0, result.stdout[-8000:] + "\n" + result.stderr[-4000:]
    record = json.loads((out / "checks.json").read_text())
    checks = record["checks"]
    assert len(checks) >= 23 and all(c["result"] == "PASS" for c in checks), checks
    names = " | ".join(c["check"] for c in checks)
    for wanted in ("teacher log-probs = direct forward", "student log-probs at step 1", "actor K3 sum",
                   "gate fraction", "gate = recomputed from the scores", "loss = pg_loss + beta", "grad norm",
                   "rewards vary", "both platforms", "rollout weights = the actor's own weights",
                   "resume" if resumed else "steps 1-3 in one process"):
        assert wanted in names
    return record


def test_both_stages_train_through_verls_megatron_engine_and_every_check_passes(run):
    out, result = run
    record = _passed(out, result)
    assert record["engines"] == {"stage1": "megatron", "actor": "megatron",
                                 "teachers": {"desktop": "megatron", "mobile": "megatron"}}
    assert record["actor_tp"] == 2
    assert any(c["check"] == "actor: one train step at TP 2 = TP 1" for c in record["checks"])
    # the teachers are the folders verl wrote through the bridge with the stage-1 checkpoints
    for platform in ("desktop", "mobile"):
        assert (out / "teachers" / platform).resolve().parts[-2:] == ("model", "huggingface")
    assert "checks passed" in result.stdout and "PASS" in result.stdout  # the table is printed
    # verl's own per-step metrics log, as its file logger writes it, both stage-2 processes
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert all("actor/mopd/k3_sum_kl_on" in line["data"] and "timing_s/step" in line["data"] for line in lines)
    phases = json.loads((out / "phases.json").read_text())
    assert [p["phase"] for p in phases] == ["data + models", "stage1/desktop", "stage1/mobile", "stage2",
                                            "stage2_resume", "actor TP 2 = TP 1", "checks"]
    assert all(p["ok"] and p["seconds"] > 0 for p in phases)
    print("\n" + "\n".join(f"{p['phase']}: {p['seconds']} s" for p in phases))


def test_both_stages_train_through_verls_fsdp_engine_and_every_check_passes(fsdp_run):
    out, result = fsdp_run
    record = _passed(out, result, resumed=False)  # the restart is the Megatron run's (--no-resume: 2.5 min less)
    assert record["engines"] == {"stage1": "fsdp", "actor": "fsdp", "teachers": {"desktop": "hf", "mobile": "hf"}}
    assert record["actor_tp"] == 1
    assert "student warm-up: 150 steps, taken from" in result.stdout  # the Megatron run's, same inputs


def _checks_of(root, only=None) -> dict[str, smoke.Check]:
    paths = smoke.Paths(root, smoke.default_recipes())
    return {c.name: c for c in smoke.run_checks(paths, smoke.PROFILES["cpu"], only=only)}


def _failed(checks: dict | Path, fragment: str) -> list[str]:
    """The checks named with ``fragment`` that fail: of ``checks``, or run on the run folder ``checks``."""
    if isinstance(checks, Path):
        checks = _checks_of(checks, only=fragment)
    return [name for name, c in checks.items() if fragment in name and not c.passed]


def test_the_checks_fail_on_runs_tampered_with(run, tmp_path):
    out, result = run
    assert result.returncode == 0
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("ckpt", "models", "teachers"))
    for name in ("models", "teachers"):
        (copy / name).symlink_to(out / name)
    (copy / "stage2" / "ckpt").symlink_to(out / "stage2" / "ckpt")
    assert all(c.passed for c in _checks_of(copy).values())

    # a teacher log-prob off by 1e-4 nats in one stored sample
    dump = copy / "stage2" / "dumps" / "step_2.pt"
    original = dump.read_bytes()
    step = torch.load(dump, weights_only=False)
    row = next(r for r in step["rows"] if r["gate"])
    row["teacher"][0] += 1e-4
    torch.save(step, dump)
    assert _failed(copy, "teacher log-probs")  # (1e-4 in one token moves the K3 sum by ~1e-8)

    # one stored gate flipped: the recomputed gate and the actor's reading of the stored one both disagree
    row["teacher"][0] -= 1e-4
    row["gate"] = 0.0
    torch.save(step, dump)
    checks = _checks_of(copy, only="step 2")
    assert _failed(checks, "step 2: gate = recomputed") and _failed(checks, "step 2: actor gate")
    row["gate"] = 1.0

    # the IS weights the loss applied replaced by 1 (the rollout runs in bf16, so they are not 1): the K3
    # check recomputes the loss's K3 with its IS weights, and tells
    def is_effect(r):  # what the sample's IS weights move the K3 sum by
        k3 = smoke.k3_reference(r["teacher"].double() - r["student"].double(), K3_LINEAR_ABOVE, K3_CLAMP_BELOW)
        return float((k3 * (r["rollout_is_weights"].double() - 1))[r["response_mask"].bool()].sum().abs())

    chosen = max((r for r in step["rows"] if r["gate"] and not r["padding"]), key=is_effect)
    assert is_effect(chosen) > 1e-5 * smoke._k3_rows(step["rows"])[0]  # far above the check's 1e-6
    weights = chosen["rollout_is_weights"]
    kept = weights.clone()
    weights.fill_(1.0)
    torch.save(step, dump)
    assert _failed(copy, "step 2: actor K3 sum")
    weights.copy_(kept)

    # one sample's stored student log-probs half a nat off (a misaligned row is off by whole nats): the
    # actor's K3 no longer matches the dump's
    row["student"] += 0.5
    torch.save(step, dump)
    assert _failed(copy, "step 2: actor K3 sum")
    row["student"] -= 0.5

    # the rollout's probability of one token it sampled 0.1 off the actor's (a rollout the last sync missed)
    probs = row["student"].double().exp()
    row["rollout"] = (probs + torch.where(probs < 0.5, 0.1, -0.1)).log().float()
    torch.save(step, dump)
    assert _failed(copy, "step 2: rollout's probabilities")
    dump.write_bytes(original)

    # the actor's step-1 log-probs of one sample 1e-4 nats off transformers' forward of the student
    first = copy / "stage2" / "dumps" / "step_1.pt"
    original_first = first.read_bytes()
    step = torch.load(first, weights_only=False)
    next(r for r in step["rows"] if not r["padding"])["student"][0] += 1e-4
    torch.save(step, first)
    assert _failed(copy, "student log-probs at step 1")
    first.write_bytes(original_first)

    # the TP 2 train step's gradient norm 1e-4 (relative) off TP 1's
    tp2 = copy / "tp_check" / "tp2.json"
    result = json.loads(tp2.read_text())
    result["engine"]["thd"]["grad_norm"] *= 1 + 1e-4
    tp2.write_text(json.dumps(result))
    assert _failed(copy, "train step at TP 2")

    # the actor's logged K3 off by 0.2 %
    metrics = copy / "stage2" / "stage2_metrics.jsonl"
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    lines[0]["data"]["actor/mopd/k3_sum_kl_on"] *= 1.002
    metrics.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    assert _failed(copy, "step 1: actor K3 sum")

    # the distillation loss over another denominator (1 % off), or the total with beta doubled
    lines[0]["data"]["actor/mopd/k3_sum_kl_on"] /= 1.002
    for key, scale in (("actor/distillation/loss", 1.01), ("actor/loss", None)):
        data = dict(lines[0]["data"])
        data[key] = data[key] * scale if scale else data["actor/pg_loss"] + 0.02 * data["actor/distillation/loss"]
        metrics.write_text("\n".join(json.dumps({**line, "data": data} if i == 0 else line)
                                     for i, line in enumerate(lines)) + "\n")
        assert _failed(copy, "step 1: distillation loss")

    # a zero or a NaN grad norm; each per-platform metric off by 1e-5 relative, or two platforms' swapped; the
    # actor's count of KL-on tokens one off
    def tampered_metrics(change) -> None:
        data = dict(lines[0]["data"])
        change(data)
        metrics.write_text("\n".join(json.dumps({**line, "data": data} if i == 0 else line)
                                     for i, line in enumerate(lines)) + "\n")

    for norm in (0.0, float("nan")):
        tampered_metrics(lambda d, norm=norm: d.update({"actor/grad_norm": norm}))
        assert _failed(copy, "step 1: grad norm")
    for key in ("mopd/kl_mask_on_fraction/desktop", "mopd/reward_mean/mobile", "mopd/response_length/desktop",
                "mopd_teacher/mobile/samples"):
        tampered_metrics(lambda d, key=key: d.update({key: d[key] * (1 + 1e-5) + 1e-5}))
        assert _failed(copy, "step 1: both platforms"), key
    def swap(d):
        d.update({k.replace("desktop", "@").replace("mobile", "desktop").replace("@", "mobile"): v
                  for k, v in d.items() if "desktop" in k or "mobile" in k})

    swapped = dict(lines[0]["data"])
    swap(swapped)
    if swapped != lines[0]["data"]:  # (two platforms with equal metrics would swap into themselves)
        tampered_metrics(swap)
        assert _failed(copy, "step 1: both platforms")
    tampered_metrics(lambda d: d.update({"actor/mopd/kl_on_tokens": d["actor/mopd/kl_on_tokens"] + 1}))
    assert _failed(copy, "step 1: actor K3 sum")
    metrics.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    assert not _failed(copy, "step 1:")

    # every rollout of a step rewarded alike (no group with mixed rewards: the PG term would be zero)
    step = torch.load(dump, weights_only=False)
    for r in step["rows"]:
        r["score"] = 1.0
    torch.save(step, dump)
    assert _failed(copy, "step 2: rewards vary")
    dump.write_bytes(original)

    # one tensor of the rollout not updated by a sync
    sync = copy / "stage2" / "rollout_sync.jsonl"
    saved_syncs = sync.read_text()
    records = [json.loads(line) for line in saved_syncs.splitlines()]
    name = next(iter(records[-1]["held"]))
    records[-1]["held"][name] = "0" * 64
    sync.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    assert _failed(copy, "rollout weights")

    # stale weights sent intact: after the last step the rollout holds (and was sent) the step before's
    records = [json.loads(line) for line in saved_syncs.splitlines()]
    records[-1]["held_stats"] = records[-2]["held_stats"]
    sync.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    assert _failed(copy, "rollout weights")
    sync.write_text(saved_syncs)

    # the resumed process starting from another sampler state, or with other held prompts
    states = copy / "stage2" / "dumps" / "batching_state.jsonl"
    saved = states.read_text()
    for tamper in (lambda r: r.update(sampler={"scheduler": "another"}), lambda r: r["held_prompts"].append("0" * 64)):
        records = [json.loads(line) for line in saved.splitlines()]
        tamper(next(r for r in records if r["step"] == 3 and r["when"] == "begin"))
        states.write_text("\n".join(json.dumps(r) for r in records) + "\n")
        assert _failed(copy, "resume")
    states.write_text(saved)
    assert not _failed(copy, "resume")

    # the sampler state on disk not the one the step ended with (the check reads only that file of the
    # checkpoint: the copy's checkpoint folder holds just it)
    from verl_mopd.batching.sampler import STATE_FILE

    (saved_state,) = (out / "stage2" / "ckpt").glob(f"*/*/global_step_{smoke.RESUME_STEP}/{STATE_FILE}")
    ckpt = copy / "stage2" / "ckpt"
    ckpt.unlink()
    state_file = ckpt / saved_state.relative_to(out / "stage2" / "ckpt")
    state_file.parent.mkdir(parents=True)
    state_file.write_text(saved_state.read_text())
    assert not _failed(copy, "resume")
    state_file.write_text(json.dumps({"state": {"scheduler": "another"}}))
    assert _failed(copy, "resume")

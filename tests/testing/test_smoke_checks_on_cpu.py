"""The smoke's own pieces that need no trainer: its float64 K3 and its command-line mistakes."""

import math

import pytest
import torch

from verl_mopd.errors import UsageError
from verl_mopd.losses import K3_CLAMP_BELOW, K3_LINEAR_ABOVE, k3_kl
from verl_mopd.testing import smoke


def test_the_float64_k3_is_the_documented_function():
    d = torch.linspace(-30, 8, 2001, dtype=torch.float64)
    ref = smoke.k3_reference(d, K3_LINEAR_ABOVE, K3_CLAMP_BELOW)
    inside = (d >= K3_CLAMP_BELOW) & (d <= K3_LINEAR_ABOVE)
    torch.testing.assert_close(ref[inside], torch.exp(d[inside]) - d[inside] - 1, rtol=1e-15, atol=0)
    above = d > K3_LINEAR_ABOVE
    slope = math.expm1(K3_LINEAR_ABOVE)
    torch.testing.assert_close(ref[above], math.exp(3) - 4 + slope * (d[above] - 3), rtol=1e-15, atol=0)
    assert torch.all(ref[d < K3_CLAMP_BELOW] == math.exp(K3_CLAMP_BELOW) - K3_CLAMP_BELOW - 1)
    # and it is what the loss computes (k3_kl is written as a custom autograd function)
    student = torch.zeros_like(d)
    torch.testing.assert_close(k3_kl(student, d), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kwargs, message", [
    ({"device": "tpu"}, "--device 'tpu'"),
    ({"engine": "deepspeed"}, "--engine 'deepspeed'"),
    ({"device": "cuda", "engine": "fsdp"}, "--engine 'fsdp' with --device 'cuda'"),
    ({"timeout": 0}, "--timeout 0"),
    ({"timeout": float("nan")}, "--timeout nan"),
    ({"warmup_steps": -1}, "--warmup-steps -1"),
])
def test_bad_options_are_user_errors_naming_the_option(kwargs, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        smoke.SmokeConfig(**kwargs)


def test_a_non_empty_out_folder_and_a_wrong_recipes_folder_are_refused(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        smoke.run_smoke(smoke.SmokeConfig(out=str(tmp_path)))
    with pytest.raises(UsageError, match="no stage2_mopd_qwen3vl8b.yaml"):
        smoke.run_smoke(smoke.SmokeConfig(out=str(tmp_path / "new"), recipes=str(tmp_path)))
    assert (tmp_path / "keep.txt").read_text() == "mine"


def _gate_rows(scores_by_group: dict[str, list[float]], gate: dict[str, float]) -> list[dict]:
    return [{"uid": uid, "score": score, "gate": gate[uid]} for uid, scores in scores_by_group.items() for score in scores]


MOPD = {"gate_metric": "acc", "tau_kl": 0.5}
#: acc means 0.25 (on), exactly 0.5 (on: the gate is "at most tau_kl"), 0.75 (off), and all wrong (on)
SCORES = {"a": [1.0, -0.5, -1.0, -1.0], "b": [1.0, 1.0, -0.5, -0.5], "c": [1.0, 1.0, 1.0, -1.0], "d": [-0.5] * 4}
RIGHT = {"a": 1.0, "b": 1.0, "c": 0.0, "d": 1.0}


def test_the_gate_check_recomputes_the_gate_from_the_scores():
    ok, detail = smoke._check_gate_value(_gate_rows(SCORES, RIGHT), MOPD)
    assert ok, detail
    assert "KL on for 12 of 16 samples" in detail and "1 exactly at tau_kl" in detail


@pytest.mark.parametrize("wrong, why", [
    ({**RIGHT, "b": 0.0}, "'<' for '<=': the group exactly at tau_kl switched off"),
    ({**RIGHT, "c": 1.0}, "a group above tau_kl left on"),
    ({"a": 0.0, "b": 0.0, "c": 1.0, "d": 0.0}, "the gate's direction inverted"),
    ({**RIGHT, "d": 0.0}, "a group of -0.5s read as fully correct (score > 0 for acc)"),
])
def test_the_gate_check_fails_on_a_wrong_gate(wrong, why):
    ok, detail = smoke._check_gate_value(_gate_rows(SCORES, wrong), MOPD)
    assert not ok, why


def test_the_gate_check_reads_kept_normalization_masks_and_rm_scores():
    kept = {uid: (1.6 if on else 0.0) for uid, on in RIGHT.items()}  # `kept` stores N/N_counted for on rows
    assert smoke._check_gate_value(_gate_rows(SCORES, kept), MOPD)[0]
    # on rm_scores with tau 0: group means -0.375, 0.25, 0.5, -0.5
    assert smoke._check_gate_value(_gate_rows(SCORES, {"a": 1.0, "b": 0.0, "c": 0.0, "d": 1.0}),
                                   {"gate_metric": "rm_scores", "tau_kl": 0.0})[0]
    ok, detail = smoke._check_gate_value(_gate_rows(SCORES, RIGHT), {"gate_metric": "format", "tau_kl": 0.5})
    assert not ok and "recomputes 'acc' and 'rm_scores' only" in detail
    assert not smoke._check_gate_value([], MOPD)[0]


def test_no_resume_runs_stage_2_in_one_process():
    import argparse

    parser = argparse.ArgumentParser()
    smoke.add_smoke_arguments(parser)
    assert parser.parse_args([]).resume is True
    assert parser.parse_args(["--no-resume"]).resume is False
    assert smoke.STAGE2_LAUNCHES[-1] == ("stage2_resume", smoke.STAGE2_STEPS)  # the one --no-resume runs (as stage2)


def _loss_rows():
    torch.manual_seed(0)
    rows = []
    for i in range(4):
        n = 5 + i
        rows.append({"gate": float(i != 1), "kl_start": None, "response_mask": torch.ones(n),
                     "teacher": torch.randn(n, dtype=torch.float32) - 2, "student": torch.randn(n) - 2,
                     "rollout_is_weights": 1 + 0.05 * torch.randn(n)})
    return rows


CONFIG = {"distillation": {"distillation_loss": {"distillation_loss_coef": 0.01}}, "mopd": {"normalization": "all"}}


def _loss_metrics(rows, config=CONFIG, pg=-0.08):
    k3_sum, on_tokens, _ = smoke._k3_rows(rows)
    tokens = on_tokens if config["mopd"]["normalization"] == "kept" else sum(len(r["response_mask"]) for r in rows)
    distillation = k3_sum / tokens
    beta = config["distillation"]["distillation_loss"]["distillation_loss_coef"]
    return {"actor/distillation/loss": distillation, "actor/pg_loss": pg, "actor/loss": pg + beta * distillation}


@pytest.mark.parametrize("normalization", ["all", "kept"])
def test_the_loss_terms_check_pins_beta_and_the_normalization(normalization):
    rows, config = _loss_rows(), {**CONFIG, "mopd": {"normalization": normalization}}
    m = _loss_metrics(rows, config)
    ok, detail = smoke._check_loss_terms(m, rows, config, 1e-3)
    assert ok, detail
    assert f"/ {sum(5 + i for i in range(4)) - 6 if normalization == 'kept' else 26} tokens ({normalization})" in detail
    for tampered in ({**m, "actor/distillation/loss": m["actor/distillation/loss"] * 1.01},   # another denominator
                     {**m, "actor/loss": m["actor/pg_loss"] + 0.02 * m["actor/distillation/loss"]},  # beta doubled
                     {**m, "actor/loss": m["actor/pg_loss"]}):  # the distillation term left out
        assert not smoke._check_loss_terms(tampered, rows, config, 1e-3)[0]
    other = {**config, "mopd": {"normalization": "kept" if normalization == "all" else "all"}}
    assert not smoke._check_loss_terms(m, rows, other, 1e-3)[0]  # the other normalization's denominator

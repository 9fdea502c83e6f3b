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

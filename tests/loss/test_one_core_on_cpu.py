"""Both entry points of the loss share one core (``losses.gated_k3``): the pure ``mopd_kl_loss`` and
verl's ``mopd_k3`` (``compute_mopd_k3`` under verl's ``distillation_ppo_loss``) give the same loss,
gradient and metrics on the same batch, gated, thought-windowed and IS-weighted, with
``normalization`` "all" and "kept", and both equal a float64 formula written from the docs."""

import math

import pytest
import torch

from verl.trainer.distillation.losses import distillation_ppo_loss
from verl.workers.config import ActorConfig, DistillationConfig

from _microbatch import build_microbatch
from verl_mopd.config import MOPDDistillationLossConfig
from verl_mopd.losses import K3_CLAMP_BELOW, K3_LINEAR_ABOVE, kept_kl_mask, mopd_kl_loss

F64 = torch.float64
BETA = 0.01


def k3_and_slope(d):
    """K3 and dK3/dd at ``d``, piecewise from the definition (float64 Python)."""
    lo, hi = K3_CLAMP_BELOW, K3_LINEAR_ABOVE
    if d < lo:
        return math.exp(lo) - lo - 1, 0.0
    if d <= hi:
        return math.exp(d) - d - 1, math.exp(d) - 1
    return (math.exp(hi) - hi - 1) + (math.exp(hi) - 1) * (d - hi), math.exp(hi) - 1


def reference(student, teacher, lens, gate, starts, weights, normalization):
    """Loss, d loss / d student (per sample, per response token) and metrics, in float64 Python.

    "all": the IS-weighted K3 of the KL-on samples' window tokens over every response token;
    "kept": over the window tokens of the KL-on samples only. The metrics: ``k3_mean_kl_on`` is the
    IS-weighted K3 over the KL-on samples' window tokens, ``k3_mean`` the same over every sample.
    """
    num = num_all = 0.0
    tokens_on = tokens_all = 0
    slope = []
    for i, n in enumerate(lens):
        slope.append([0.0] * n)
        for t in range(starts[i], n):
            k, s = k3_and_slope(teacher[i][t] - student[i][t])
            num_all += k * weights[i][t]
            tokens_all += 1
            if gate[i]:
                num += k * weights[i][t]
                tokens_on += 1
                slope[i][t] = -s * weights[i][t]  # d K3 / d student = -d K3 / d d
    den = sum(lens) if normalization == "all" else tokens_on
    grads = [[g / den for g in row] for row in slope]
    metrics = {
        "mopd/k3_mean_kl_on": num / tokens_on,
        "mopd/kl_mask_on_fraction": sum(1 for g in gate if g) / len(gate),
        "mopd/k3_sum_kl_on": num,
        "mopd/kl_on_tokens": float(tokens_on),
        "mopd/kl_on_samples": float(sum(1 for g in gate if g)),
        "mopd/k3_mean": num_all / tokens_all,
    }
    return num / den, grads, metrics


@pytest.mark.parametrize("normalization", ["all", "kept"])
def test_both_entry_points_give_the_same_loss_gradient_and_metrics(normalization):
    prompt_lens, resp_lens = [3, 2, 4, 2, 5, 3], [6, 4, 7, 3, 5, 2]
    gate = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    starts = torch.tensor([2, 1, 0, 3, 0, 1])  # sample 3: the window starts at its end (no KL token)
    g = torch.Generator().manual_seed(5)
    weights = [torch.rand(r, generator=g, dtype=F64) + 0.5 for r in resp_lens]
    data, out, leaf, teacher, pos = build_microbatch(prompt_lens, resp_lens, seed=5)
    data["mopd_kl_start"] = starts
    data["rollout_is_weights"] = torch.nested.as_nested_tensor(weights, layout=torch.jagged)
    response_mask = data["response_mask"].to_padded_tensor(0)
    # what the driver stores as mopd_kl_mask (trainer/gate.py calls kept_kl_mask for "kept")
    stored = gate if normalization == "all" else kept_kl_mask(gate, response_mask, starts)
    data["mopd_kl_mask"] = stored

    # verl's path: distillation_ppo_loss (PG part 0: zero advantages) over compute_mopd_k3
    actor = ActorConfig(strategy="fsdp", ppo_mini_batch_size=6, ppo_micro_batch_size_per_gpu=6, rollout_n=1)
    dist = DistillationConfig(enabled=False, distillation_loss=MOPDDistillationLossConfig(distillation_loss_coef=BETA))
    verl_loss, verl_metrics = distillation_ppo_loss(actor, dist, model_output=out, data=data)
    verl_loss.backward()
    verl_kl = verl_metrics["distillation/loss"].values[0]
    verl_grad = [leaf.grad[p] / BETA for p in pos]

    # the pure path on the same tensors, padded (bs, response_len)
    T = max(resp_lens)
    pure_leaf = leaf.detach().clone().requires_grad_(True)
    student_BT = torch.stack([torch.nn.functional.pad(pure_leaf[p], (0, T - len(p))) for p in pos])
    teacher_BT = torch.stack([torch.nn.functional.pad(teacher[p], (0, T - len(p))) for p in pos])
    weights_BT = torch.stack([torch.nn.functional.pad(w, (0, T - len(w))) for w in weights])
    pure_loss, pure_metrics = mopd_kl_loss(student_BT, teacher_BT, response_mask.to(F64), gate,
                                           kl_start_index=starts, rollout_is_weights=weights_BT,
                                           normalization=normalization)
    pure_loss.backward()
    pure_grad = [pure_leaf.grad[p] for p in pos]

    want_loss, want_grad, want_metrics = reference(
        [leaf.detach()[p].tolist() for p in pos], [teacher[p].tolist() for p in pos], resp_lens, gate.tolist(),
        starts.tolist(), [w.tolist() for w in weights], normalization)
    assert want_loss > 0 and any(any(row) for row in want_grad)
    assert pure_loss.item() == pytest.approx(want_loss, rel=1e-12)
    assert verl_kl == pytest.approx(want_loss, rel=1e-12)
    for i in range(len(resp_lens)):
        want = torch.tensor(want_grad[i], dtype=F64)
        torch.testing.assert_close(pure_grad[i], want, rtol=1e-10, atol=1e-15)
        torch.testing.assert_close(verl_grad[i], want, rtol=1e-10, atol=1e-15)
        if not gate[i]:
            assert (pure_grad[i] == 0).all() and (verl_grad[i] == 0).all()

    assert set(pure_metrics) == set(want_metrics)
    for name, want in want_metrics.items():
        rel = 1e-7 if name == "mopd/kl_mask_on_fraction" else 1e-12  # a float32 mean, as verl logs it
        assert pure_metrics[name] == pytest.approx(want, rel=rel), name
    # verl logs every metric but k3_mean (a gated-off sample's teacher log-probs may be a stand-in)
    ours = {k: v for k, v in verl_metrics.items() if k.startswith("mopd/")}
    assert set(ours) == set(want_metrics) - {"mopd/k3_mean"}
    for name, metric in ours.items():
        assert float(metric.values[0]) == pytest.approx(pure_metrics[name], rel=1e-12), name

"""mopd_kl_loss / k3_kl under bad shapes, NaN teachers, empty batches and the plain-K3 setting."""

import math

import pytest
import torch

from verl.trainer.distillation.losses import distillation_ppo_loss
from verl.workers.config import ActorConfig, DistillationConfig

from _microbatch import build_microbatch
from verl_mopd.config import MOPDDistillationLossConfig
from verl_mopd.losses import k3_kl, mopd_kl_loss

F64 = torch.float64
MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _batch(bs=3, t=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    student = -torch.rand(bs, t, generator=g, dtype=F64) * 3
    teacher = student + torch.randn(bs, t, generator=g, dtype=F64)
    mask = torch.ones(bs, t, dtype=F64)
    mask[0, 3:] = 0  # a short response: padding after it
    return student, teacher, mask


def _loss_and_grad(student, teacher, mask, **kw):
    s = student.clone().requires_grad_(True)
    loss, metrics = mopd_kl_loss(s, teacher, mask, **kw)
    loss.backward()
    return loss, s.grad, metrics


# ------------------------------------------------------------------------ shapes


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"response_mask": torch.ones(3, 1)}, r"response_mask has shape \(3, 1\); expected \(3, 5\)"),
        ({"response_mask": torch.ones(5)}, r"response_mask has shape \(5,\); expected \(3, 5\)"),
        ({"response_mask": torch.ones(3, 6)}, r"response_mask has shape \(3, 6\)"),
        ({"kl_mask": torch.ones(1)}, r"kl_mask has shape \(1,\); expected \(3,\) or \(3, 1\)"),
        ({"kl_mask": torch.ones(3, 5)}, r"kl_mask has shape \(3, 5\)"),
        ({"kl_mask": torch.ones(4, 1)}, r"kl_mask has shape \(4, 1\)"),
        ({"kl_start_index": torch.zeros(3, 1, dtype=torch.long)}, r"kl_start_index has shape \(3, 1\); expected \(3,\)"),
        ({"teacher_log_probs": torch.zeros(3, 4)}, r"teacher_log_probs \(3, 4\) must have the same shape"),
        ({"student_log_probs": torch.zeros(3, 5, dtype=torch.long)}, "must be floating point"),
    ],
)
def test_a_wrong_shape_is_an_error_naming_the_argument(kw, message):
    args = {"student_log_probs": torch.zeros(3, 5), "teacher_log_probs": torch.zeros(3, 5),
            "response_mask": torch.ones(3, 5)}
    args.update(kw)
    with pytest.raises(ValueError, match=message):
        mopd_kl_loss(**args)


def test_k3_kl_gate_and_token_mask_shapes():
    with pytest.raises(ValueError, match=r"kl_mask has shape \(1,\)"):
        k3_kl(torch.zeros(2, 3), torch.zeros(2, 3), kl_mask=torch.ones(1))
    with pytest.raises(ValueError, match=r"token_mask has shape \(2, 1\)"):
        k3_kl(torch.zeros(2, 3), torch.zeros(2, 3), token_mask=torch.ones(2, 1))


# -------------------------------------------------------------- NaN never leaks


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_bad_teacher_value_on_a_masked_token_changes_nothing(mode, bad):
    student, teacher, mask = _batch()
    clean_loss, clean_grad, clean_metrics = _loss_and_grad(student, teacher, mask, loss_agg_mode=mode)
    poisoned = teacher.clone()
    poisoned[0, 3:] = bad  # on the padding
    loss, grad, metrics = _loss_and_grad(student, poisoned, mask, loss_agg_mode=mode)
    assert torch.equal(loss, clean_loss) and torch.equal(grad, clean_grad)
    assert (grad[0, 3:] == 0).all() and metrics == clean_metrics


@pytest.mark.parametrize("normalization", ["all", "kept"])
@pytest.mark.parametrize("mode", MODES)
def test_a_nan_teacher_on_a_gated_off_sample_gives_exactly_zero(mode, normalization):
    student, teacher, mask = _batch()
    gate = torch.tensor([1.0, 0.0, 1.0])
    clean_loss, clean_grad, _ = _loss_and_grad(student, teacher, mask, kl_mask=gate, loss_agg_mode=mode,
                                               normalization=normalization)
    poisoned = teacher.clone()
    poisoned[1] = math.nan
    loss, grad, metrics = _loss_and_grad(student, poisoned, mask, kl_mask=gate, loss_agg_mode=mode,
                                         normalization=normalization)
    assert torch.equal(loss, clean_loss) and torch.equal(grad, clean_grad) and (grad[1] == 0).all()
    assert all(math.isfinite(v) for v in metrics.values())


def test_a_nan_on_a_counted_token_stays_visible():
    student, teacher, mask = _batch()
    teacher[2, 1] = math.nan
    loss, grad, _ = _loss_and_grad(student, teacher, mask)
    assert math.isnan(loss.item()) and torch.isnan(grad[2, 1])


def test_a_nan_teacher_on_a_gated_row_through_verls_distillation_loss():
    """The verl path: mopd_kl_mask gates row 1; its teacher log-probs are NaN; the gradient there is the PG part only."""
    prompt_lens, resp_lens, gate = [3, 2, 4], [4, 3, 2], [1.0, 0.0, 1.0]
    actor = ActorConfig(strategy="fsdp", ppo_mini_batch_size=3, ppo_micro_batch_size_per_gpu=3, rollout_n=1)
    dist = DistillationConfig(enabled=False, distillation_loss=MOPDDistillationLossConfig(distillation_loss_coef=0.01))
    grads = []
    for poison in (False, True):
        data, out, leaf, teacher, pos = build_microbatch(prompt_lens, resp_lens, kl_mask=gate, seed=3)
        if poison:
            teacher = teacher.clone()
            teacher[pos[1]] = math.nan
            seq = torch.tensor([0] + [p + r for p, r in zip(prompt_lens, resp_lens)]).cumsum(0)
            data["teacher_logprobs"] = torch.nested.as_nested_tensor(
                [teacher[seq[i] : seq[i + 1]].unsqueeze(-1) for i in range(3)], layout=torch.jagged)
        loss, _ = distillation_ppo_loss(actor, dist, model_output=out, data=data)
        loss.backward()
        grads.append((loss.detach(), leaf.grad.clone()))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


# ---------------------------------------------------------- nothing to average


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "case",
    ["empty_batch", "empty_responses", "all_masked", "kept_all_gated", "start_beyond_the_end", "zero_global_tokens"],
)
def test_nothing_to_average_gives_zero_and_a_zero_gradient(mode, case):
    student, teacher, mask = _batch()
    kw = {"loss_agg_mode": mode}
    if case == "empty_batch":
        student, teacher, mask = student[:0], teacher[:0], mask[:0]
    elif case == "empty_responses":
        student, teacher, mask = student[:, :0], teacher[:, :0], mask[:, :0]
    elif case == "all_masked":
        mask = torch.zeros_like(mask)
        teacher[0, 0] = math.nan  # masked anyway
    elif case == "kept_all_gated":
        kw.update(kl_mask=torch.zeros(3), normalization="kept")
    elif case == "start_beyond_the_end":
        kw.update(kl_start_index=torch.full((3,), 10))
    else:
        if mode == "token-sum":
            return
        mask = torch.zeros_like(mask)
        kw.update(batch_num_tokens=0, global_batch_size=0)
    loss, grad, metrics = _loss_and_grad(student, teacher, mask, **kw)
    assert loss.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))
    assert all(math.isfinite(v) for v in metrics.values())


# ---------------------------------------------------------------- plain K3


def test_linear_above_inf_is_the_exact_k3_value_and_gradient():
    d = torch.linspace(-19.0, 30.0, 981, dtype=F64)
    student = torch.zeros_like(d, requires_grad=True)
    k = k3_kl(student, d, linear_above=math.inf)
    k.sum().backward()
    want = torch.tensor([math.exp(x) - x - 1 for x in d.tolist()], dtype=F64)
    torch.testing.assert_close(k, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(student.grad, -(torch.exp(d) - 1), rtol=1e-12, atol=1e-12)
    assert (k[d > 3.01] > k3_kl(torch.zeros_like(d), d)[d > 3.01]).all()  # above 3 it departs from the default
    loss, _ = mopd_kl_loss(torch.zeros(1, 3), torch.full((1, 3), 5.0), torch.ones(1, 3), linear_above=math.inf)
    assert loss.item() == pytest.approx(math.exp(5) - 6)

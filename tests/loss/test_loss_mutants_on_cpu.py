"""Tests that kill mutants found by scripts/mutation.sh in verl_mopd/losses.py (docs/reliability.md,
"Mutation testing"): "kept" weights without padding flags, with nothing or one token counted; the loss
with rollout-IS weights, a custom clamp and verl's global batch info; a </think> at position 0.
Expected values are K3 = exp(d) - d - 1 written out in float64."""

import math

import numpy as np
import pytest
import torch

from verl_mopd.losses import kept_kl_mask, mopd_kl_loss, thought_end_index


def _k3(d: float) -> float:
    return math.exp(d) - d - 1.0


def test_kept_weights_without_padding_flags_count_every_row():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    # 6 response tokens; counted: rows 0 and 2 (KL on), 3 + 1 = 4 tokens
    got = kept_kl_mask(torch.tensor([1.0, 0.0, 1.0]), mask)
    torch.testing.assert_close(got, torch.tensor([1.5, 0.0, 1.5]))


def test_kept_weights_with_nothing_or_one_token_counted():
    mask = torch.tensor([[1, 0], [1, 1]])
    assert kept_kl_mask(torch.tensor([0.0, 0.0]), mask).tolist() == [0.0, 0.0]  # all off: 0, not NaN
    # one counted token of three: weight 3
    assert kept_kl_mask(torch.tensor([1.0, 0.0]), mask).tolist() == [3.0, 0.0]


def test_the_loss_applies_the_is_weights_and_the_clamp_it_is_given():
    student = torch.zeros(1, 3, dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor([[0.5, -5.0, 1.0]], dtype=torch.float64)
    weights = torch.tensor([[2.0, 1.0, 0.5]], dtype=torch.float64)
    loss, metrics = mopd_kl_loss(student, teacher, torch.ones(1, 3), rollout_is_weights=weights, clamp_below=-1.0)
    want = (2.0 * _k3(0.5) + 1.0 * _k3(-1.0) + 0.5 * _k3(1.0)) / 3  # d = -5 is held at the clamp, -1
    assert loss.item() == pytest.approx(want, rel=1e-12)
    assert metrics["mopd/k3_sum_kl_on"] == pytest.approx(want * 3, rel=1e-12)


def test_the_loss_passes_verls_global_batch_info_through():
    student = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor([[0.5, 1.0], [-0.5, 0.25]], dtype=torch.float64)
    total = _k3(0.5) + _k3(1.0) + _k3(-0.5) + _k3(0.25)
    # this rank's 4 tokens of 10 in the global batch, 2 data-parallel ranks: sum / 10 * 2
    loss, _ = mopd_kl_loss(student, teacher, torch.ones(2, 2), dp_size=2, batch_num_tokens=10)
    assert loss.item() == pytest.approx(total / 10 * 2, rel=1e-12)
    # a global batch with no token: never a division by zero
    loss, _ = mopd_kl_loss(student, teacher, torch.ones(2, 2), batch_num_tokens=0)
    assert math.isfinite(loss.item())


def test_a_think_end_at_position_0_is_an_end_even_at_the_length_limit():
    responses = torch.tensor([[99, 5, 6], [5, 6, 7]])
    mask = torch.ones(2, 3, dtype=torch.int64)
    start = thought_end_index(responses, mask, 99, truncated=torch.tensor([True, True]))
    assert start.tolist() == [1, 3]  # row 1 was cut off inside its thought: its window starts past its end


def test_k3_bounds_accept_a_zero_or_small_linear_part_and_refuse_an_empty_interval():
    from verl_mopd.losses import k3_kl

    s = torch.zeros(1, 2, dtype=torch.float64)
    t = torch.tensor([[-0.5, 2.0]], dtype=torch.float64)
    # linear_above = 0: the tangent at 0 is the constant 0 above it
    assert k3_kl(s, t, linear_above=0.0)[0].tolist() == pytest.approx([_k3(-0.5), 0.0], rel=1e-12)
    # linear_above = 0.5: above it, the tangent K3(0.5) + (e^0.5 - 1)(d - 0.5)
    want = _k3(0.5) + math.expm1(0.5) * 1.5
    assert k3_kl(s, t, linear_above=0.5)[0].tolist() == pytest.approx([_k3(-0.5), want], rel=1e-12)
    with pytest.raises(ValueError, match="need clamp_below < linear_above"):
        k3_kl(s, t, clamp_below=1.0, linear_above=1.0)


def test_k3_shape_errors_are_named():
    from verl_mopd.losses import k3_kl

    with pytest.raises(ValueError, match=r"^token_mask has shape \(2,\); expected \(1, 2\) \(bs, response_len\), as "
                                         r"the log-probs$"):
        k3_kl(torch.zeros(1, 2), torch.zeros(1, 2), token_mask=torch.ones(2))
    with pytest.raises(ValueError, match=r"^kl_mask needs log-probs of shape \(bs, response_len\)$"):
        k3_kl(torch.tensor(0.0), torch.tensor(0.5), kl_mask=torch.ones(1))


def test_k3_of_one_log_prob_per_sample_and_the_students_dtype():
    from verl_mopd.losses import k3_kl

    got = k3_kl(torch.zeros(2, dtype=torch.float64), torch.tensor([0.5, 1.0], dtype=torch.float64),
                kl_mask=torch.tensor([1.0, 0.0]))
    assert got.tolist() == pytest.approx([_k3(0.5), 0.0], rel=1e-12)
    # a float64 teacher is read in the student's float32
    assert k3_kl(torch.zeros(1, 2), torch.tensor([[0.5, 1.0]], dtype=torch.float64)).dtype == torch.float32


def test_a_nan_on_a_token_that_does_not_count_gives_0_and_a_counted_one_stays_nan():
    from verl_mopd.losses import k3_kl

    nan = float("nan")
    student = torch.zeros(3, 2, dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor([[0.5, nan], [nan, 0.5], [nan, 0.25]], dtype=torch.float64)
    kl_mask = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    # the gate alone: row 1 is off, so its NaN gives 0; rows 0 and 2 count, their NaN stays visible
    k = k3_kl(student, teacher, kl_mask=kl_mask).detach()
    assert k[1].tolist() == [0.0, 0.0]
    assert math.isnan(k[0, 1]) and math.isnan(k[2, 0]) and k[0, 0].item() == pytest.approx(_k3(0.5))
    # the gate and a token mask: row 0's token 1 is masked out (0), row 1 is off (0), row 2's token 0 counts
    token_mask = torch.tensor([[1, 0], [1, 1], [1, 1]])
    k = k3_kl(student, teacher, kl_mask=kl_mask, token_mask=token_mask)
    kd = k.detach()
    assert kd[0, 1].item() == 0.0 and kd[1].tolist() == [0.0, 0.0] and math.isnan(kd[2, 0])
    k[torch.isfinite(kd)].sum().backward()
    assert torch.isfinite(student.grad[0]).all() and student.grad[1].tolist() == [0.0, 0.0]


def test_reward_gate_messages_name_the_shape_and_the_first_non_finite_scores():
    from verl_mopd.losses import reward_gate

    with pytest.raises(ValueError, match=r"^scores must be 1-D \(bs,\), got shape \(2, 1\)$"):
        reward_gate(torch.zeros(2, 1), ["a", "b"], 0.5)
    nan, inf = float("nan"), float("inf")
    with pytest.raises(ValueError, match=r"^scores must be finite for the reward gate, got \[nan, inf, -inf\]$"):
        reward_gate(torch.tensor([nan, 1.0, inf, -inf, nan]), list("abcde"), 0.5)


def test_reward_gate_group_ids_of_any_hashable_and_a_column_shape():
    from verl_mopd.losses import reward_gate

    # 1 and "1" are different groups: means 1.0 (above tau: off) and 0.0 (on)
    assert reward_gate([1.0, 0.0], [1, "1"], 0.5).tolist() == [0.0, 1.0]
    # a (bs, 1) column of ids is read as (bs,)
    ids = np.array([["u0"], ["u0"], ["u1"], ["u1"]], dtype=object)
    assert reward_gate([1.0, 1.0, 1.0, 0.0], ids, 0.5).tolist() == [0.0, 0.0, 1.0, 1.0]

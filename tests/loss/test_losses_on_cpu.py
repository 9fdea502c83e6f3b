"""The MOPD loss: K3, the reward gate, mopd_kl_loss and the verl adapter (mopd_k3)."""

import itertools
import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl.trainer.ppo.core_algos import agg_loss, kl_penalty

from verl_mopd.losses import K3_CLAMP_BELOW, K3_LINEAR_ABOVE, k3_kl, mopd_kl_loss, reward_gate, thought_end_index

F64 = torch.float64


def k3_reference(d):
    """Straight from the definition, piecewise, in float64 Python."""
    lo, hi = K3_CLAMP_BELOW, K3_LINEAR_ABOVE
    if d < lo:
        d = lo
    if d <= hi:
        return math.exp(d) - d - 1
    return (math.exp(hi) - hi - 1) + (math.exp(hi) - 1) * (d - hi)


# ---------------------------------------------------------------- K3 values


def test_k3_matches_float64_reference_on_a_grid():
    d = torch.linspace(-30, 40, 2801, dtype=F64)
    student = torch.zeros_like(d)
    got = k3_kl(student, d)
    want = torch.tensor([k3_reference(x) for x in d.tolist()], dtype=F64)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_k3_equals_verl_k3_wherever_verl_does_not_clamp():
    g = torch.Generator().manual_seed(0)
    student = -torch.rand(20000, generator=g, dtype=F64) * 30
    teacher = -torch.rand(20000, generator=g, dtype=F64) * 30
    verl = kl_penalty(logprob=student, ref_logprob=teacher, kl_penalty="k3")
    d = teacher - student
    unclamped = (d.abs() < 20) & (verl < 10)
    assert unclamped.sum() > 5000 and (~unclamped).sum() > 1000  # both regimes are exercised
    ours = k3_kl(student, teacher)
    torch.testing.assert_close(ours[unclamped], verl[unclamped], rtol=1e-12, atol=1e-12)
    # where verl clamps, ours is never below verl's clamped value (it does not saturate)
    assert (ours[~unclamped] >= verl[~unclamped] - 1e-12).all()


def test_k3_is_nonnegative_convex_and_finite_even_for_minus_inf_teacher():
    d = torch.linspace(-60, 60, 12001, dtype=F64)
    k = k3_kl(torch.zeros_like(d), d)
    assert (k >= 0).all() and torch.isfinite(k).all()
    # convex on [clamp_below, inf): the linear continuation keeps it so. (Below clamp_below it is
    # constant: no function that is convex there and decreasing can stay finite at -inf.)
    kc = k[d >= K3_CLAMP_BELOW]
    second_diff = kc[2:] - 2 * kc[1:-1] + kc[:-2]
    assert (second_diff >= -1e-9).all()

    student = torch.tensor([[-0.5, -3.0, -1.0]], dtype=F64, requires_grad=True)
    teacher = torch.tensor([[-math.inf, -math.inf, -0.2]], dtype=F64)
    k = k3_kl(student, teacher)
    k.sum().backward()
    assert torch.isfinite(k).all() and torch.isfinite(student.grad).all()
    assert k[0, 0].item() == pytest.approx(k3_reference(K3_CLAMP_BELOW))


def test_gradient_is_kept_where_verl_k3_clamps_it_to_zero():
    # the student 10 nats below the teacher: verl's k3 has a zero gradient, ours the tangent slope
    student = torch.tensor([-12.0, -1.0], dtype=F64, requires_grad=True)
    teacher = torch.tensor([-2.0, -1.5], dtype=F64)
    verl_student = student.detach().clone().requires_grad_(True)
    kl_penalty(logprob=verl_student, ref_logprob=teacher, kl_penalty="k3").sum().backward()
    assert verl_student.grad[0] == 0.0
    k3_kl(student, teacher).sum().backward()
    assert student.grad[0] == pytest.approx(-math.expm1(K3_LINEAR_ABOVE))  # bounded and non-zero
    assert student.grad[1] == pytest.approx(1 - math.exp(-0.5))  # exact K3 gradient 1 - e^d
    torch.testing.assert_close(verl_student.grad[1], student.grad[1])


def test_gradcheck_float64_across_all_three_regions():
    g = torch.Generator().manual_seed(1)
    teacher = torch.tensor([[-0.3, -8.0, -0.1, -40.0, -2.0, -1.0]], dtype=F64)
    # d = teacher - student spans the clamped, exact and linear regions, away from the two kinks
    student = torch.tensor([[-0.6, -1.0, -9.0, -1.0, -0.5, -2.5]], dtype=F64)
    student = (student + 0.01 * torch.rand(student.shape, generator=g, dtype=F64)).requires_grad_(True)
    kl_mask = torch.tensor([[0.5]], dtype=F64)
    assert torch.autograd.gradcheck(lambda s: k3_kl(s, teacher), (student,))
    assert torch.autograd.gradcheck(lambda s: k3_kl(s, teacher, kl_mask=kl_mask), (student,))


def test_k3_on_an_empty_micro_batch():
    student = torch.zeros(3, 0, requires_grad=True)
    k = k3_kl(student, torch.zeros(3, 0))
    k.sum().backward()
    assert k.shape == (3, 0)


def test_k3_rejects_bad_shapes_and_thresholds():
    with pytest.raises(ValueError, match="same shape"):
        k3_kl(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="clamp_below < linear_above"):
        k3_kl(torch.zeros(2), torch.zeros(2), linear_above=1.0, clamp_below=2.0)


# ------------------------------------------- which divergence: the exact-vocabulary identity


def _softmax_logp(logits):
    return torch.log_softmax(logits, dim=-1)


def test_backpropagated_k3_has_the_forward_kl_gradient_single_token():
    """E_{y~S}[grad K3(y)] == grad KL(T || S), enumerating the whole vocabulary (float64)."""
    g = torch.Generator().manual_seed(2)
    vocab = 7
    theta = (0.5 * torch.randn(vocab, generator=g, dtype=F64)).requires_grad_(True)
    logp_t = _softmax_logp(0.5 * torch.randn(vocab, generator=g, dtype=F64))
    logp_s = _softmax_logp(theta)
    assert ((logp_t - logp_s).abs() < K3_LINEAR_ABOVE).all()  # stay on the exact region

    weights = logp_s.detach().exp()  # sampling probabilities: not differentiated
    (expected_k3_grad,) = torch.autograd.grad((weights * k3_kl(logp_s, logp_t)).sum(), theta, retain_graph=True)
    forward_kl = (logp_t.exp() * (logp_t - logp_s)).sum()
    (forward_grad,) = torch.autograd.grad(forward_kl, theta, retain_graph=True)
    reverse_kl = (logp_s.exp() * (logp_s - logp_t)).sum()
    (reverse_grad,) = torch.autograd.grad(reverse_kl, theta)

    torch.testing.assert_close(expected_k3_grad, forward_grad, rtol=0, atol=1e-6)
    assert (expected_k3_grad - reverse_grad).abs().max() > 1e-3  # and not the reverse KL's


def test_backpropagated_k3_on_sequences_is_the_forward_kl_on_student_states():
    """Two-token sequences from a tabular autoregressive toy policy, every sequence enumerated.

    Per token, backpropagated K3 gives sum_t E_{h_t ~ S}[ grad KL(T(.|h_t) || S(.|h_t)) ]: the
    forward KL at each state the student visits (the states are the student's, not the teacher's).
    """
    g = torch.Generator().manual_seed(3)
    vocab = 4
    theta1 = (0.4 * torch.randn(vocab, generator=g, dtype=F64)).requires_grad_(True)
    theta2 = (0.4 * torch.randn(vocab, vocab, generator=g, dtype=F64)).requires_grad_(True)
    t1 = _softmax_logp(0.4 * torch.randn(vocab, generator=g, dtype=F64))
    t2 = _softmax_logp(0.4 * torch.randn(vocab, vocab, generator=g, dtype=F64))
    s1, s2 = _softmax_logp(theta1), _softmax_logp(theta2)

    loss = torch.zeros((), dtype=F64)
    for y1, y2 in itertools.product(range(vocab), repeat=2):
        p_seq = (s1[y1] + s2[y1, y2]).detach().exp()
        student = torch.stack([s1[y1], s2[y1, y2]]).unsqueeze(0)
        teacher = torch.stack([t1[y1], t2[y1, y2]]).unsqueeze(0)
        loss = loss + p_seq * k3_kl(student, teacher).sum()
    k3_grads = torch.autograd.grad(loss, (theta1, theta2), retain_graph=True)

    state_weights = s1.detach().exp()  # P_S(h_2 = y1)
    fkl_states = (t1.exp() * (t1 - s1)).sum() + (state_weights * (t2.exp() * (t2 - s2)).sum(-1)).sum()
    fkl_grads = torch.autograd.grad(fkl_states, (theta1, theta2))
    for a, b in zip(k3_grads, fkl_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


# ------------------------------------------------------------------- the reward gate


def gate_reference(scores, groups, tau):
    by_group = defaultdict(list)
    for s, gid in zip(scores, groups):
        by_group[gid].append(s)
    return [1.0 if sum(by_group[gid]) / len(by_group[gid]) <= tau else 0.0 for gid in groups]


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", "d", "e"]), st.sampled_from([-1.0, -0.5, 0.0, 0.5, 1.0])),
        min_size=1,
        max_size=40,
    ),
    tau=st.sampled_from([-1.0, -0.5, -0.25, 0.0, 0.1, 0.25, 0.5, 1.0]),
)
def test_reward_gate_matches_python_reference(rows, tau):
    groups = np.array([g for g, _ in rows], dtype=object)
    scores = torch.tensor([s for _, s in rows])
    assert reward_gate(scores, groups, tau).tolist() == gate_reference(scores.tolist(), list(groups), tau)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), n_micro=st.integers(2, 5))
def test_reward_gate_travels_with_samples_through_shuffled_micro_batches(seed, n_micro):
    rng = np.random.default_rng(seed)
    uids = np.array([f"uid-{i // 8}" for i in range(32)], dtype=object)  # 4 GRPO groups of n=8
    acc = torch.tensor(rng.integers(0, 2, 32), dtype=torch.float32)
    gate = reward_gate(acc, uids, 0.1)
    perm = rng.permutation(32)
    for chunk in np.array_split(perm, n_micro):  # the workers' shuffled micro-batches
        torch.testing.assert_close(gate[chunk], reward_gate(acc, uids, 0.1)[chunk])
    # the gate is equivariant under permutation of the step batch
    torch.testing.assert_close(reward_gate(acc[perm], uids[perm], 0.1), gate[perm])


def test_reward_gate_paper_table_and_inputs():
    # groups: mean acc 0 (teacher needed), 0.125 (> 0.1: off), 0.1 exactly (<= tau: on)
    uids = ["g0"] * 8 + ["g1"] * 8 + ["g2"] * 10
    acc = [0.0] * 8 + [1.0] + [0.0] * 7 + [1.0] + [0.0] * 9
    gate = reward_gate(torch.tensor(acc, dtype=F64), np.array(uids, dtype=object), 0.1)
    assert gate.tolist() == [1.0] * 8 + [0.0] * 8 + [1.0] * 10
    assert reward_gate([1.0, 1.0], torch.tensor([7, 7]), 0.5).tolist() == [0.0, 0.0]  # tensor ids
    with pytest.raises(ValueError, match="finite"):
        reward_gate([float("nan")], ["a"], 0.1)
    with pytest.raises(ValueError, match="entries"):
        reward_gate([1.0, 0.0], ["a"], 0.1)


# --------------------------------------------------------------------- mopd_kl_loss


def _random_batch(bs=6, t=9, seed=4):
    g = torch.Generator().manual_seed(seed)
    student = (-torch.rand(bs, t, generator=g, dtype=F64) * 4).requires_grad_(True)
    teacher = student.detach() + torch.randn(bs, t, generator=g, dtype=F64) * 2
    lengths = torch.randint(1, t + 1, (bs,), generator=g)
    mask = (torch.arange(t) < lengths[:, None]).to(F64)
    return student, teacher, mask


@pytest.mark.parametrize("mode", ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_mopd_kl_loss_is_verl_agg_loss_of_gated_k3(mode):
    student, teacher, mask = _random_batch()
    gate = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    loss, metrics = mopd_kl_loss(student, teacher, mask, gate, mode)
    ref = agg_loss(k3_kl(student, teacher) * gate[:, None].to(F64), mask, mode)
    torch.testing.assert_close(loss, ref)
    assert metrics["mopd/kl_mask_on_fraction"] == pytest.approx(4 / 6)
    k = k3_kl(student, teacher).detach()
    assert metrics["mopd/k3_mean"] == pytest.approx(((k * mask).sum() / mask.sum()).item())
    on = gate.bool()
    assert metrics["mopd/k3_mean_kl_on"] == pytest.approx(((k * mask)[on].sum() / mask[on].sum()).item())


def test_mopd_kl_loss_masked_samples_get_exactly_zero_gradient_even_with_nan_teacher():
    student, teacher, mask = _random_batch()
    teacher = teacher.clone()
    teacher[1] = float("nan")  # a gated-off sample the teacher was never asked about
    gate = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    loss, _ = mopd_kl_loss(student, teacher.nan_to_num(0.0), mask, gate)
    loss.backward()
    assert (student.grad[1] == 0).all()
    assert torch.isfinite(loss)


def test_mopd_kl_loss_normalization_all_vs_kept():
    student, teacher, mask = _random_batch()
    gate = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    k = k3_kl(student, teacher).detach()
    loss_all, _ = mopd_kl_loss(student, teacher, mask, gate, normalization="all")
    loss_kept, _ = mopd_kl_loss(student, teacher, mask, gate, normalization="kept")
    kept_sum = (k * mask * gate[:, None]).sum()
    assert loss_all.item() == pytest.approx((kept_sum / mask.sum()).item())
    assert loss_kept.item() == pytest.approx((kept_sum / (mask * gate[:, None]).sum()).item())
    with pytest.raises(ValueError, match="normalization"):
        mopd_kl_loss(student, teacher, mask, gate, normalization="tokens")


def test_kl_skip_thought_window():
    think_end = 99
    responses = torch.tensor([[5, 99, 7, 8, 0], [5, 6, 7, 8, 9], [99, 6, 99, 8, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    start = thought_end_index(responses, mask, think_end)
    assert start.tolist() == [2, 0, 3]  # after the LAST </think>; none -> the whole response
    student = torch.zeros(3, 5, dtype=F64, requires_grad=True)
    teacher = torch.full((3, 5), -1.0, dtype=F64)
    loss, _ = mopd_kl_loss(student, teacher, mask.to(F64), None, "token-sum", kl_start_index=start)
    loss.backward()
    expected_tokens = torch.tensor([[0, 0, 1, 1, 0], [1, 1, 1, 1, 1], [0, 0, 0, 1, 0]], dtype=F64)
    torch.testing.assert_close(student.grad != 0, expected_tokens.bool())
    assert loss.item() == pytest.approx(expected_tokens.sum().item() * k3_reference(-1.0))


def test_a_truncated_thought_gets_no_kl():
    """N11: with ``kl_skip_thought`` a response cut off at the length limit before any ``</think>`` is
    all thought: no KL on it. One that ended on its own without ``</think>`` keeps the KL on every
    token (it answered without a thought); a truncated one with ``</think>`` keeps the KL after it."""
    think_end = 99
    responses = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0], [5, 99, 7, 8, 9], [5, 6, 7, 8, 9]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    truncated = torch.tensor([True, False, True, False])
    start = thought_end_index(responses, mask, think_end, truncated=truncated)
    assert start.tolist() == [5, 0, 2, 0]
    student = torch.zeros(4, 5, dtype=F64, requires_grad=True)
    teacher = torch.full((4, 5), -1.0, dtype=F64)
    loss, _ = mopd_kl_loss(student, teacher, mask.to(F64), None, "token-sum", kl_start_index=start)
    loss.backward()
    assert (student.grad[0] == 0).all() and (student.grad[1, :3] != 0).all() and (student.grad[2, 2:] != 0).all()
    assert loss.item() == pytest.approx((0 + 3 + 3 + 5) * k3_reference(-1.0))

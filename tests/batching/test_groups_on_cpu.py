"""Group verdicts and env-failure masking against float64 references."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_mopd.batching.groups import classify_group, masked_grpo_advantage, read_env_failure


@pytest.mark.parametrize(
    "scores, failed, kw, kind",
    [
        ([1.0, -0.5, -1.0, 1.0], [False] * 4, {}, "mixed"),
        ([-0.5] * 4, [False] * 4, {}, "dropped_uniform"),  # verl's DAPO also drops all -0.5 groups
        ([-1.0] * 4, [False] * 4, {"uniform_groups": "kl_only"}, "kl_only"),
        ([1.0] * 4, [False] * 4, {"uniform_groups": "kl_only", "kl_only_max_score": 0.5}, "dropped_uniform"),
        ([1.0, 1.0, 1.0, -1.0], [False, False, False, True], {}, "dropped_uniform"),
        ([1.0, -1.0, -1.0, -1.0], [False, True, True, True], {}, "dropped_too_few_valid"),
    ],
)
def test_classify_group_table(scores, failed, kw, kind):
    assert classify_group(scores, failed, **kw).kind == kind


def test_read_env_failure_sources():
    assert read_env_failure({"reward_extra_info": {"env_failure": True}}, {})
    assert read_env_failure({"env_failure": 1}, None)
    assert read_env_failure({}, {"env_failure": "true"})
    assert not read_env_failure({"reward_extra_info": {"env_failure": False}}, {"env_failure": True})
    assert not read_env_failure(None, None)
    assert read_env_failure({}, {"crashed": True}, key="crashed")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from([1.0, -0.5, -1.0]), st.booleans()), min_size=1, max_size=24))
def test_masked_grpo_matches_float64_reference(rows):
    group = np.array([f"g{g}" for g, _, _ in rows], dtype=object)
    score = torch.tensor([s for _, s, _ in rows])
    valid = torch.tensor([not f for _, _, f in rows])
    T = 3
    rewards = torch.zeros(len(rows), T)
    rewards[:, -1] = score
    rewards[~valid, -1] = float("nan")  # must never leak
    mask = torch.ones(len(rows), T)
    adv, new_mask, counts = masked_grpo_advantage(rewards, mask, group, valid)
    assert torch.isfinite(adv).all()
    for i, (g, s, f) in enumerate(rows):
        peers = [ss for (gg, ss, ff) in rows if gg == g and not ff]
        if f or len(peers) < 2:
            assert new_mask[i].sum() == 0 and adv[i].abs().sum() == 0
        else:
            ref = (s - np.mean(peers)) / (np.std(peers, ddof=1) + 1e-6)
            np.testing.assert_allclose(adv[i].numpy(), ref * np.ones(T), rtol=1e-4, atol=1e-4)
            assert new_mask[i].sum() == T
    assert counts["env_failures"] == int((~valid).sum())

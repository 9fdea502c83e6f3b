"""Group verdicts and env-failure masking against float64 references."""

import pytest

from verl_mopd.batching.groups import classify_group, read_env_failure


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



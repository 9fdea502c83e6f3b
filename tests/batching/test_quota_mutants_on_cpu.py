"""Tests that kill mutants found by scripts/mutation.sh in verl_mopd/batching/quota.py
(docs/reliability.md, "Mutation testing"): a checkpointed state's messages and its bounds, at the edge."""

import re

import pytest

from verl_mopd.batching.quota import QuotaConfig, QuotaScheduler


def _scheduler():
    return QuotaScheduler(QuotaConfig(shares={"desktop": 0.5, "mobile": 0.5}))


def _state(**change):
    state = {"shares": {"desktop": 0.5, "mobile": 0.5}, "granted_total": {"desktop": 4, "mobile": 4},
             "accepted_total": {"desktop": 5, "mobile": 3}, "fallback_slots_total": 1,
             "fallback_batches_total": 1, "batches_total": 2}
    state.update(change)
    return state


def test_a_state_that_is_not_an_object_is_named_by_its_type():
    with pytest.raises(ValueError, match="^scheduler state is a list; expected an object$"):
        _scheduler().load_state_dict([1, 2])


@pytest.mark.parametrize("value, shown", [
    ([4, 4], "list"),
    ({"desktop": 4}, "['desktop']"),
    ({"desktop": 4, "mobile": 4, "tablet": 0}, "['desktop', 'mobile', 'tablet']"),
])
def test_per_domain_counters_name_what_they_have(value, shown):
    with pytest.raises(ValueError, match=re.escape(f"granted_total has {shown}; expected a count for each domain "
                                                   "['desktop', 'mobile']")):
        _scheduler().load_state_dict(_state(granted_total=value))


def test_fallback_counters_may_reach_but_not_pass_their_bounds():
    s = _scheduler()
    # every slot granted by the fallback, in every batch: the largest counts a run can reach
    s.load_state_dict(_state(fallback_slots_total=8, fallback_batches_total=2))
    assert (s.fallback_slots_total, s.fallback_batches_total, s.batches_total) == (8, 2, 2)
    with pytest.raises(ValueError, match="fallback counters"):
        _scheduler().load_state_dict(_state(fallback_slots_total=9))
    with pytest.raises(ValueError, match="fallback counters"):
        _scheduler().load_state_dict(_state(fallback_batches_total=3))


def _reference_fallback(counts, shares, pending, free):
    """The documented rule, written out: each free slot to the donor (a domain with buffered groups)
    furthest below its target share, lowest count / share first."""
    picks = []
    counts, pending = dict(counts), dict(pending)
    for _ in range(free):
        donors = [d for d in sorted(pending) if pending[d]]
        if not donors:
            break
        d = min(donors, key=lambda d: counts[d] / shares[d])
        picks.append(d)
        counts[d] += 1
        pending[d] -= 1
    return picks


def test_the_fallback_gives_slots_to_the_donor_furthest_below_its_share_and_counts_them():
    shares = {"a": 0.45, "b": 0.35, "c": 0.2}
    s = QuotaScheduler(QuotaConfig(shares=shares, max_wait_groups=0))
    assert s.start_batch(7, now=0.0) == {"a": 3, "b": 3, "c": 1}
    # b and c deliver plenty, a nothing: a's 3 slots go to b and c by the fallback
    for i in range(8):
        s.add(f"b{i}", "b")
    for i in range(6):
        s.add(f"c{i}", "c")
    decision = s.poll(now=0.0)
    picks = _reference_fallback({"a": 0, "b": 3, "c": 1}, shares, {"a": 0, "b": 5, "c": 5}, 3)
    assert picks == ["c", "b", "c"]  # 1/0.2 < 3/0.35; 2/0.2 > 3/0.35; 2/0.2 < 4/0.35 (no ties)
    assert decision.fallback and decision.batch == ["b0", "b1", "b2", "c0", "c1", "b3", "c2"]
    assert s.last_batch == {"accepted": {"a": 0, "b": 4, "c": 3}, "quotas": {"a": 3, "b": 3, "c": 1},
                            "fallback_slots": 3, "fallback": True}
    assert s.accepted_total == {"a": 0, "b": 4, "c": 3}
    assert s.granted_total == {"a": 3, "b": 3, "c": 1}
    assert (s.fallback_slots_total, s.fallback_batches_total, s.batches_total) == (3, 1, 1)


def test_a_second_fallback_poll_counts_the_slots_the_first_gave():
    shares = {"a": 0.5, "b": 0.25, "c": 0.25}
    s = QuotaScheduler(QuotaConfig(shares=shares, max_wait_groups=0))
    assert s.start_batch(8, now=0.0) == {"a": 4, "b": 2, "c": 2}
    for i in range(4):
        s.add(f"b{i}", "b")
    s.add("c0", "c")
    s.add("c1", "c")
    first = s.poll(now=0.0)
    # b's 2 buffered groups take 2 of a's 4 slots; nothing else to give
    assert first.batch is None and first.fallback
    assert s.fallback_accepted == ["b2", "b3"]
    for i in range(4, 8):
        s.add(f"b{i}", "b")
    for i in range(2, 6):
        s.add(f"c{i}", "c")
    decision = s.poll(now=0.0)
    # counts now: b 2 + 2 = 4 (16 per share), c 2 (8): c, then c (12 < 16)
    assert decision.batch[-2:] == ["c2", "c3"]
    assert s.last_batch["accepted"] == {"a": 0, "b": 4, "c": 4}


def test_backpressure_ahead_pauses_a_domain_once_it_covers_the_next_batch_too():
    s = QuotaScheduler(QuotaConfig(shares={"desktop": 0.5, "mobile": 0.5}, backpressure_ahead_batches=1))
    s.start_batch(4, now=0.0)  # quotas 2 and 2; paused at 2 + 1 * 0.5 * 4 = 4 accepted + buffered
    for i in range(3):
        s.add(f"d{i}", "desktop")
    assert s.paused_domains() == frozenset()
    assert s.poll(now=0.0).paused == frozenset()  # 2 accepted + 1 buffered
    s.add("d3", "desktop")
    assert s.paused_domains() == {"desktop"}


def test_a_domain_with_a_zero_quota_is_never_paused_and_one_with_quota_one_is():
    s = QuotaScheduler(QuotaConfig(shares={"a": 0.75, "b": 0.25}))
    assert s.start_batch(1, now=0.0) == {"a": 1, "b": 0}
    assert s.paused_domains() == frozenset()
    s.add("a0", "a")
    assert s.can_fill("a") and s.can_fill("b")  # covered exactly; b needs nothing
    assert s.paused_domains() == {"a"}

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


def test_no_fallback_when_every_domain_fills_its_quota_even_with_a_zero_wait_bound():
    s = QuotaScheduler(QuotaConfig(shares={"desktop": 0.5, "mobile": 0.5}, max_wait_groups=0))
    s.start_batch(4, now=0.0)
    for i in range(2):
        s.add(f"d{i}", "desktop")
        s.add(f"m{i}", "mobile")
    decision = s.poll(now=0.0)
    assert decision.batch == ["d0", "d1", "m0", "m1"] and decision.fallback is False
    assert decision.paused == frozenset()
    assert (s.fallback_batches_total, s.fallback_slots_total) == (0, 0)
    # polling the closed batch again gives the same batch, nothing paused, the same fallback flag
    again = s.poll(now=1.0)
    assert again.batch == decision.batch and again.paused == frozenset() and again.fallback is False


def test_scheduler_misuse_is_named():
    s = _scheduler()
    with pytest.raises(RuntimeError, match=r"^poll called with no open batch; call start_batch first$"):
        s.poll(now=0.0)
    s.start_batch(2, now=0.0)
    with pytest.raises(RuntimeError, match=r"^start_batch called while a batch is open; finish it with poll\(\) "
                                           r"first$"):
        s.start_batch(2, now=0.0)
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError, match=f"^batch_size={bad!r}; must be a positive int$"):
            s.quotas_for(bad)


def test_quotas_follow_the_cumulative_deficit_over_batches():
    """floor(share * batch) each, the extra slots to the largest cumulative deficit: target over the
    slots after this batch, minus what was granted before, minus this batch's floor. Batch 4, by hand:
    granted so far 11, 3, 9 of 23 slots; targets at 33 slots 16.5, 4.125, 12.375; floors 5, 1, 3;
    deficits 0.5, 0.125, 0.375: the one extra slot goes to d0."""
    s = QuotaScheduler(QuotaConfig(shares={"d0": 0.5, "d1": 0.125, "d2": 0.375}))
    got = []
    for size in (10, 8, 5, 10, 6, 4):
        quotas = s.quotas_for(size)
        got.append(quotas)
        for d, q in quotas.items():
            s.granted_total[d] += q
    assert got == [{"d0": 5, "d1": 1, "d2": 4}, {"d0": 4, "d1": 1, "d2": 3}, {"d0": 2, "d1": 1, "d2": 2},
                   {"d0": 6, "d1": 1, "d2": 3}, {"d0": 3, "d1": 1, "d2": 2}, {"d0": 2, "d1": 0, "d2": 2}]
    # and the granted mix stays within one group of the target
    total = sum(s.granted_total.values())
    assert all(abs(s.granted_total[d] - share * total) < 1 for d, share in s.config.shares.items())


@pytest.mark.parametrize("shares, message", [
    ({}, "quota.shares is empty; give a share per domain, e.g. {mobile: 0.5, desktop: 0.5}"),
    ({"": 1.0}, "quota.shares has key ''; keys must be non-empty domain names"),
    ({1: 1.0}, "quota.shares has key 1; keys must be non-empty domain names"),
    ({"a": True}, "quota.shares['a']=True; must be a number > 0"),
    ({"a": 0, "b": 1.0}, "quota.shares['a']=0; must be a number > 0"),
])
def test_bad_shares_are_named(shares, message):
    with pytest.raises(ValueError) as err:
        QuotaConfig(shares=shares)
    assert str(err.value) == "invalid quota config:\n  - " + message


def test_every_config_error_is_listed_one_a_line():
    with pytest.raises(ValueError) as err:
        QuotaConfig(shares={"a": 1.0}, max_wait_seconds=float("inf"), backpressure_ahead_batches=-1)
    assert str(err.value) == (
        "invalid quota config:\n"
        "  - quota.max_wait_seconds=inf; must be a finite number of seconds >= 0 (default 600): a domain whose "
        "rollouts hang finishes no group, so only this bound ends the wait\n"
        "  - quota.backpressure_ahead_batches=-1; must be an int >= 0")


def test_shares_are_stored_as_floats_keyed_by_name():
    cfg = QuotaConfig(shares={"a": 1})
    assert cfg.shares == {"a": 1.0} and type(cfg.shares["a"]) is float


def test_a_new_scheduler_has_no_batch_no_quota_and_pauses_nothing():
    s = QuotaScheduler(QuotaConfig(shares={"desktop": 0.5, "mobile": 0.5}, backpressure_ahead_batches=1))
    assert s.last_batch is None
    assert s.progress() == {"desktop": (0, 0), "mobile": (0, 0)}
    s.add("d0", "desktop")  # a group that arrives before the first batch opens
    assert s.paused_domains() == frozenset()


def test_the_group_bound_counts_only_groups_finished_while_waiting():
    s = QuotaScheduler(QuotaConfig(shares={"desktop": 0.5, "mobile": 0.5}, max_wait_groups=1))
    s.start_batch(4, now=0.0)
    s.add("d0", "desktop")
    s.add("d1", "desktop")  # desktop covers its quota only now: no group finished while waiting yet
    decision = s.poll(now=0.0)
    assert decision.batch is None and decision.fallback is False
    s.note_finished("desktop")  # one group finished while the batch waits on mobile: the bound
    s.add("d2", "desktop")
    s.add("d3", "desktop")
    decision = s.poll(now=0.0)
    assert decision.fallback is True and decision.batch == ["d0", "d1", "d2", "d3"]


def test_slots_the_fallback_gave_in_an_earlier_poll_count_once_each():
    s = QuotaScheduler(QuotaConfig(shares={"a": 0.4, "b": 0.2, "c": 0.4}, max_wait_groups=0))
    assert s.start_batch(7, now=0.0) == {"a": 3, "b": 1, "c": 3}
    s.add("b0", "b")
    s.add("b1", "b")
    assert s.poll(now=0.0).batch is None and s.fallback_accepted == ["b1"]  # nothing else to give yet
    for i in range(2, 8):
        s.add(f"b{i}", "b")
    for i in range(6):
        s.add(f"c{i}", "c")
    assert s._tie_order["b"] < s._tie_order["c"]  # the seeded tie order: b first on a tie
    decision = s.poll(now=0.0)
    # a's 3 slots, 1 given: b counts 1 + 1 = 2 (2 / 0.2 = 10), c 3 (7.5): c3; then b 10 = c 10: b2
    assert decision.batch == ["b0", "c0", "c1", "c2", "b1", "c3", "b2"]

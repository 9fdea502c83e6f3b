"""QuotaScheduler under random arrivals, dropped groups, evictions and hanging domains.

The simulation keeps its own books (which groups exist, which domain supplies what, how long the
batch has waited) and checks the scheduler against them: every batch has exactly batch_size
groups, no group is lost, duplicated or used after it went away, and once the wait bound is
reached a batch closes as soon as there are enough groups to fill it.
"""

import ast
import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_mopd.batching import quota as quota_module
from verl_mopd.batching.quota import QuotaConfig, QuotaScheduler

NOTHING, VALID, DROPPED = 0, 1, 2


@st.composite
def scenarios(draw):
    n = draw(st.integers(2, 3))
    domains = [f"dom{i}" for i in range(n)]
    weights = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    ticks = draw(st.integers(5, 120))
    return {
        "shares": {d: w / sum(weights) for d, w in zip(domains, weights)},
        "batch_size": draw(st.integers(1, 10)),
        "max_wait_groups": draw(st.sampled_from([None, 0, 1, 3, 8])),
        "max_wait_seconds": draw(st.sampled_from([0.0, 2.0, 5.0, 30.0])),
        "seed": draw(st.integers(0, 3)),
        # per tick and domain: nothing, a valid group, or a group the filter dropped
        "events": draw(st.lists(st.lists(st.sampled_from([NOTHING, VALID, VALID, DROPPED]), min_size=n, max_size=n),
                                min_size=ticks, max_size=ticks)),
        # a domain hangs (finishes nothing, ever again) from this tick on; None: never
        "hang_from": {d: draw(st.one_of(st.none(), st.integers(0, ticks))) for d in domains},
        # per tick: evict the k-th live group (stale eviction), if any
        "evict": draw(st.lists(st.one_of(st.none(), st.integers(0, 50)), min_size=ticks, max_size=ticks)),
        "drain_after_batch": draw(st.booleans()),  # sync trainers discard the surplus
    }


@settings(max_examples=150, deadline=None)
@given(sc=scenarios())
def test_no_group_lost_or_duplicated_no_batch_oversized_no_wait_past_the_bound(sc):
    cfg = QuotaConfig(shares=sc["shares"], max_wait_groups=sc["max_wait_groups"],
                      max_wait_seconds=sc["max_wait_seconds"], seed=sc["seed"])
    sched, domains, B = QuotaScheduler(cfg), sorted(sc["shares"]), sc["batch_size"]
    live: dict[tuple, str] = {}  # groups the scheduler should hold -> domain
    batched, evicted, drained, added = set(), set(), set(), []
    quotas = sched.start_batch(B, now=0.0)
    waited, wait_start, paused = 0, None, frozenset()

    def waiting():
        supply = {d: sum(1 for dd in live.values() if dd == d) for d in domains}
        short = [d for d in domains if supply[d] < quotas[d]]
        return bool(short) and len(short) < len(domains)

    for t, row in enumerate(sc["events"]):
        now = float(t + 1)
        for d, event in zip(domains, row):
            hung = sc["hang_from"][d] is not None and t >= sc["hang_from"][d]
            if hung or d in paused or event == NOTHING:
                continue  # producers honour backpressure, as the trainer's refill does
            waited += waiting()
            if event == VALID:
                gid = ("g", t, d)
                sched.add(gid, d)
                live[gid] = d
                added.append(gid)
            else:
                sched.note_finished(d)
        k = sc["evict"][t]
        if k is not None and live:
            gid = sorted(live)[k % len(live)]
            assert sched.remove(gid)
            del live[gid]
            evicted.add(gid)
        if waiting() and wait_start is None:
            wait_start = now
        bound_reached = (cfg.max_wait_groups is not None and waited >= cfg.max_wait_groups) or (
            wait_start is not None and now - wait_start >= cfg.max_wait_seconds
        )
        enough = len(live) >= B
        decision = sched.poll(now)
        if decision.batch is None:
            if bound_reached:  # the bound ends the wait: the batch closes, or every producer may fill it
                assert not enough, "waited past the bound with enough groups to fill the batch"
                assert not decision.paused, "producers still paused past the bound"
            paused = decision.paused
            continue
        batch = decision.batch
        assert len(batch) == B
        assert len(set(batch)) == B and not set(batch) & batched, "a group used twice"
        assert all(g in live for g in batch), "a batch holds a group that went away"
        for g in batch:
            del live[g]
        batched |= set(batch)
        if sc["drain_after_batch"]:
            out = sched.drain()
            assert set(out) == set(live) and len(out) == len(live)
            drained |= set(out)
            live.clear()
        quotas = sched.start_batch(B, now=now)
        waited, wait_start, paused = 0, None, frozenset()

    # every group the scheduler still holds is exactly a live one: nothing lost, nothing extra
    for gid in list(live):
        assert sched.remove(gid), f"group {gid} was lost"
    for gid in batched | evicted | drained:
        assert not sched.remove(gid)
    assert len(added) == len(set(added)) == len(batched) + len(evicted) + len(drained) + len(live)


def test_a_late_domain_after_the_fallback_never_overflows_the_batch():
    sched = QuotaScheduler(QuotaConfig(shares={"east": 0.5, "west": 0.5}, max_wait_groups=0))
    assert sched.start_batch(6, now=0.0) == {"east": 3, "west": 3}
    for i in range(4):
        sched.add(f"w{i}", "west")
    first = sched.poll(now=1.0)
    assert first.batch is None and first.fallback  # east is short: w3 took one of its slots
    for i in range(3):
        sched.add(f"e{i}", "east")
    decision = sched.poll(now=2.0)
    assert decision.batch == ["e0", "e1", "w0", "w1", "w2", "w3"]
    assert sched.buffered() == {"east": 1, "west": 0} and sched.last_batch["fallback_slots"] == 1


def test_a_hanging_domain_is_bounded_by_time_when_the_group_bound_cannot_fire():
    """The recipe's shape: a large group bound; the short domain hangs; the full one is paused."""
    sched = QuotaScheduler(QuotaConfig(shares={"east": 0.5, "west": 0.5}, max_wait_groups=64, max_wait_seconds=10.0))
    sched.start_batch(4, now=0.0)
    paused, n, closed_at = frozenset(), 0, None
    for t in range(1, 40):
        if "west" not in paused:  # east hangs: it never finishes anything
            sched.add(f"w{n}", "west")
            n += 1
        decision = sched.poll(now=float(t))
        if decision.batch is not None:
            closed_at = t
            break
        paused = decision.paused
    # west fills its 2 slots by t=2 and is paused; the wait starts at t=2, falls back at t=12,
    # west is released and fills east's 2 slots by t=14
    assert closed_at == 14 and n == 4 and sched.fallback_slots_total == 2


def test_evicting_an_accepted_group_reopens_its_slot():
    sched = QuotaScheduler(QuotaConfig(shares={"east": 0.5, "west": 0.5}, max_wait_groups=100))
    sched.start_batch(2, now=0.0)
    sched.add("e0", "east")
    assert sched.poll(0.0).batch is None and sched.progress()["east"] == (1, 1)
    assert sched.remove("e0") and sched.progress()["east"] == (0, 1)
    sched.add("e1", "east")
    sched.add("w0", "west")
    assert sched.poll(1.0).batch == ["e1", "w0"]


def test_the_batch_size_invariant_is_code_not_an_assert():
    tree = ast.parse(inspect.getsource(quota_module))
    assert not [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Assert)]  # python -O would drop them


@pytest.mark.parametrize(
    "state, match",
    [
        ({"granted_total": {"east": "two", "west": 1}}, r"granted_total\['east'\]='two'"),
        ({"granted_total": {"east": float("nan"), "west": 1}}, r"granted_total\['east'\]=nan"),
        ({"accepted_total": {"east": -1, "west": 3}}, r"accepted_total\['east'\]=-1"),
        ({"accepted_total": {"east": 1}}, "expected a count for each domain"),
        ({"accepted_total": {"east": 1, "west": 1, "north": 0}}, "expected a count for each domain"),
        ({"accepted_total": {"east": 5, "west": 5}}, "count different numbers of slots"),
        ({"fallback_slots_total": 99}, "exceed the slots granted"),
        ({"batches_total": None}, "batches_total=None"),
        ({"shares": {"east": 1.0}}, "differ from configured"),
    ],
)
def test_a_malformed_checkpoint_state_is_refused_naming_the_field(state, match):
    good = {"shares": {"east": 0.5, "west": 0.5}, "granted_total": {"east": 2, "west": 2},
            "accepted_total": {"east": 1, "west": 3}, "fallback_slots_total": 1, "fallback_batches_total": 1,
            "batches_total": 2}
    sched = QuotaScheduler(QuotaConfig(shares={"east": 0.5, "west": 0.5}))
    sched.load_state_dict(good)
    before = sched.state_dict()
    with pytest.raises(ValueError, match=match):
        sched.load_state_dict({**good, **state})
    assert sched.state_dict() == before

"""QuotaScheduler properties (MintAct §3.4.2): exact batches, used once, shares within one group, bounded wait."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_mopd.batching.quota import QuotaConfig, QuotaScheduler

shares_st = st.lists(st.integers(1, 9), min_size=1, max_size=4).map(
    lambda w: {f"d{i}": x / sum(w) for i, x in enumerate(w)}
)


def run(sched, arrivals, batch_size, batches):
    """arrivals: a deterministic stream of domains (one new group per tick). Returns the batches."""
    out, it, gid = [], iter(arrivals), 0
    for _ in range(batches):
        sched.start_batch(batch_size, now=float(gid))
        while True:
            decision = sched.poll(now=float(gid))
            if decision.batch is not None:
                out.append(decision.batch)
                break
            d = next(it)
            sched.add(("g", gid, d), d)
            gid += 1
    return out


@settings(max_examples=60, deadline=None)
@given(shares=shares_st, batch_size=st.integers(1, 40), seed=st.integers(0, 5))
def test_all_supplying_exact_size_used_once_and_shares_within_one(shares, batch_size, seed):
    sched = QuotaScheduler(QuotaConfig(shares=shares, max_wait_groups=10_000, seed=seed))
    domains = sorted(shares)
    arrivals = [domains[i % len(domains)] for i in range(100_000)]
    batches = run(sched, arrivals, batch_size, batches=5)
    flat = [g for b in batches for g in b]
    assert all(len(b) == batch_size for b in batches)
    assert len(flat) == len(set(flat))
    for b in batches:
        for d in domains:
            assert abs(sum(g[2] == d for g in b) - shares[d] * batch_size) < 1
    assert sched.fallback_slots_total == 0


@settings(max_examples=60, deadline=None)
@given(batch_size=st.integers(2, 40), wait=st.integers(0, 30), seed=st.integers(0, 3))
def test_silent_domain_stalls_at_most_the_bound(batch_size, wait, seed):
    sched = QuotaScheduler(QuotaConfig(shares={"fast": 0.5, "silent": 0.5}, max_wait_groups=wait, seed=seed))
    batches = run(sched, ["fast"] * 100_000, batch_size, batches=3)
    produced = max(g[1] for b in batches for g in b) + 1
    # Per batch: the fast quota (<= ceil(B/2)), then at most `wait` groups of waiting, then done.
    assert produced <= 3 * max(batch_size, (batch_size + 1) // 2 + wait)
    assert all(len(b) == batch_size for b in batches)
    assert sched.fallback_batches_total == 3
    assert sched.fallback_slots_total == sched.granted_total["silent"]  # every silent slot given away, counted


def test_silent_domain_bounded_in_seconds():
    sched = QuotaScheduler(QuotaConfig(shares={"fast": 0.5, "silent": 0.5}, max_wait_groups=None, max_wait_seconds=5.0))
    sched.start_batch(4, now=0.0)
    for i in range(6):
        sched.add(i, "fast")
    assert sched.poll(now=1.0).batch is None  # waiting starts at t=1
    assert sched.poll(now=5.9).batch is None
    decision = sched.poll(now=6.0)
    assert decision.batch == [0, 1, 2, 3] and decision.fallback
    assert sched.fallback_slots_total == 2 and sched.buffered() == {"fast": 2, "silent": 0}


def test_backpressure_pauses_the_domain_ahead():
    sched = QuotaScheduler(QuotaConfig(shares={"mobile": 0.5, "desktop": 0.5}, max_wait_groups=100))
    sched.start_batch(4, now=0.0)
    sched.add("m0", "mobile")
    assert sched.poll(0.0).paused == frozenset()
    sched.add("m1", "mobile")
    assert sched.poll(0.0).paused == {"mobile"} and sched.progress() == {"mobile": (2, 2), "desktop": (0, 2)}


def test_quotas_alternate_the_odd_slot_and_state_roundtrips():
    sched = QuotaScheduler(QuotaConfig(shares={"a": 0.5, "b": 0.5}, seed=7))
    got = []
    for t in range(4):
        q = sched.start_batch(3, now=float(t))
        got.append(q)
        for i in range(3):
            sched.add((t, "a", i), "a")
            sched.add((t, "b", i), "b")
        assert sched.poll(float(t)).batch is not None
        sched.drain()
    assert sorted(q["a"] for q in got) == [1, 1, 2, 2]
    clone = QuotaScheduler(QuotaConfig(shares={"a": 0.5, "b": 0.5}, seed=7))
    clone.load_state_dict(sched.state_dict())
    assert clone.quotas_for(3) == sched.quotas_for(3)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"shares": {}}, "shares is empty"),
        ({"shares": {"a": 0.7, "b": 0.7}}, "must sum to 1"),
        ({"shares": {"a": -1.0, "b": 2.0}}, r"shares\['a'\]=-1.0"),
        ({"shares": {"a": 1.0}, "max_wait_seconds": None}, "max_wait_seconds=None; must be a finite"),
        ({"shares": {"a": 1.0}, "max_wait_seconds": float("inf")}, "max_wait_seconds=inf"),
        ({"shares": {"a": 1.0}, "max_wait_groups": -2}, "max_wait_groups=-2"),
    ],
)
def test_config_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        QuotaConfig(**kw)


def test_unknown_domain_and_double_add_are_errors():
    sched = QuotaScheduler(QuotaConfig(shares={"a": 1.0}))
    sched.start_batch(2, 0.0)
    with pytest.raises(ValueError, match="domain 'web' has no quota"):
        sched.add(1, "web")
    sched.add(1, "a")
    with pytest.raises(ValueError, match="added twice"):
        sched.add(1, "a")

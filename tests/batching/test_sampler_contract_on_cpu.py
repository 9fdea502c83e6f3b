"""The quota samplers' contract on verl 0.9.1's real TransferQueue (on a local Ray): a field the
sampler needs and a trajectory lacks is an error naming both; the optional ``extra_info`` /
``extra_fields`` may be absent; a refill that yields nothing backs off and stops (docs/batching.md)."""

from __future__ import annotations

import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from verl.utils.tensordict_utils import list_of_dict_to_tensordict
from verl_mopd.batching.sampler import BatchingConfig, QuotaReplayBuffer, QuotaReplayBufferAsync

SHARES = {"desktop": 0.5, "mobile": 0.5}
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def tq():
    """A local Ray cluster with the real TransferQueue (controller + one storage unit) on it."""
    import ray
    import transfer_queue
    from verl.utils import transferqueue_utils

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    transfer_queue.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    yield transfer_queue
    transfer_queue.close()
    transferqueue_utils.TQ_INITIALIZED = False
    ray.shutdown()


@pytest.fixture
def clean(tq):
    yield tq
    for partition, items in (tq.kv_list() or {}).items():
        if items:
            tq.kv_clear(keys=list(items), partition_id=partition)


def write_group(tq, uid, scores, domain="mobile", drop=(), extra_info=None, env_failed=()):
    """One finished GRPO group, stored as verl's v1 agent loop stores it (``{uid}_{session}_0``);
    ``drop``: fields the listed sessions lack; ``extra_info``: per session (None = no field)."""
    for s, score in enumerate(scores):
        rm = torch.zeros(3)
        rm[-1] = score
        row = {"rm_scores": rm, "platform": domain, "uid": uid,
               "extra_fields": {"reward_extra_info": {"acc": float(score == 1.0)}}}
        info = (extra_info or {}).get(s, {"index": s})
        if info is not None:
            row["extra_info"] = {**info, **({"env_failure": True} if s in env_failed else {})}
        for name, sessions in dict(drop).items():
            if s in sessions:
                row.pop(name)
        tq.kv_put(f"{uid}_{s}_0", "train", fields=list_of_dict_to_tensordict([row]),
                  tag={"status": "success", "global_steps": 1})
    tq.kv_put(uid, "train", tag={"is_prompt": True, "status": "finished", "global_steps": 1})


def build(cls, refill, mode="sync", poll_interval=0.0, **over):
    kwargs = {"quota": {"shares": SHARES, "max_wait_groups": 64}, "train_batch_size": 2}
    kwargs.update(over)
    return cls(trainer_mode=mode, trainer_config=OmegaConf.create({}),
               max_off_policy_threshold=None if mode == "sync" else 4, max_off_policy_strategy="drop",
               sampler_kwargs=OmegaConf.create(kwargs), poll_interval=poll_interval, refill_fn=refill,
               clock=lambda: 0.0)


class Refill:
    """verl's ``refill_fn`` contract: called with a prompt count; ``after`` empty calls it writes
    one finished desktop group per call (a dataloader that dried up, then came back)."""

    def __init__(self, tq, after=None):
        self.tq, self.after, self.calls = tq, after, []

    def __call__(self, n):
        self.calls.append(n)
        if self.after is None or len(self.calls) <= self.after:
            return 0
        write_group(self.tq, f"r{len(self.calls)}", [1.0, -1.0], domain="desktop")
        return n


SAMPLERS = [(QuotaReplayBuffer, "sync"), (QuotaReplayBufferAsync, "separate_async")]


# ------------------------------------------------------------------ missing fields


@pytest.mark.parametrize("cls, mode", SAMPLERS, ids=["sync", "async"])
def test_a_trajectory_without_the_domain_column_names_it_the_sample_and_the_domains(clean, cls, mode):
    write_group(clean, "a", [1.0, -1.0], domain="desktop")
    write_group(clean, "b", [1.0, -1.0, -0.5], domain="mobile", drop={"platform": [1]})
    rb = build(cls, Refill(clean), mode)
    with pytest.raises(ValueError) as err:
        rb.sample(1, "train", 2)
    message = str(err.value)
    assert message.startswith("trajectory 'b_1_0' (group b, partition 'train') has no field 'platform' in "
                              "TransferQueue (1 of 5 trajectories lack it): ")
    assert "domain_key='platform'" in message and "['desktop', 'mobile'] (quota.shares)" in message


def test_a_missing_task_score_names_rm_scores_and_the_alternative(clean):
    write_group(clean, "a", [1.0, -1.0], domain="desktop", drop={"rm_scores": [0, 1]})
    write_group(clean, "b", [1.0, -1.0], domain="mobile")
    with pytest.raises(ValueError, match=r"trajectory 'a_0_0' .* no field 'rm_scores' .*2 of 4 trajectories.*"
                                         r"filter_metric='reward'.*or set filter_metric to a reward_extra_info key"):
        build(QuotaReplayBuffer, Refill(clean)).sample(1, "train", 2)


def test_a_dataset_without_extra_info_is_served(clean):
    write_group(clean, "a", [1.0, -1.0], domain="desktop", extra_info={0: None, 1: None})
    write_group(clean, "b", [1.0, -1.0], domain="mobile", extra_info={0: None, 1: None})
    batch, _ = build(QuotaReplayBuffer, Refill(clean)).sample(1, "train", 2)
    assert sorted(batch.keys) == ["a_0_0", "a_1_0", "b_0_0", "b_1_0"]


def test_an_env_failure_flag_is_read_where_other_rows_lack_extra_info(clean):
    # TransferQueue leaves extra_info out of a batch read when any row lacks it; the flag of b_0_0 must
    # still be seen (read key by key), so b_0_0 leaves the batch.
    write_group(clean, "a", [1.0, -1.0], domain="desktop", extra_info={0: None, 1: None})
    write_group(clean, "b", [-1.0, 1.0, -0.5], domain="mobile", extra_info={0: {}, 1: None, 2: None},
                env_failed=[0])
    batch, metrics = build(QuotaReplayBuffer, Refill(clean), filter_metric="acc").sample(1, "train", 2)
    assert sorted(batch.keys) == ["a_0_0", "a_1_0", "b_1_0", "b_2_0"]
    assert metrics["batching/env_failure/masked_samples"] == 1


# ------------------------------------------------------------------ empty refills


@pytest.mark.parametrize("cls, mode", SAMPLERS, ids=["sync", "async"])
def test_an_empty_refill_backs_off_and_stops_with_a_message(clean, cls, mode):
    write_group(clean, "m", [1.0, -1.0], domain="mobile")  # desktop never comes
    refill = Refill(clean)
    rb = build(cls, refill, mode, poll_interval=0.01, max_empty_refills=5)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        rb.sample(1, "train", 2)
    elapsed = time.monotonic() - start
    assert len(refill.calls) == 5  # not a busy-poll: 16,611 calls in 8 s before (review/peer_tests.md)
    assert elapsed >= 0.01 + 0.02 + 0.04 + 0.08  # the back-off after each of the first 4 empty refills
    message = str(err.value)
    assert message.startswith("the quota sampler's refill yielded no prompt 5 times in a row "
                              "(trainer.v1.sampler.sampler_kwargs.max_empty_refills=5): ")
    assert "Refill" in message and "{'desktop': '0/1', 'mobile': '1/1'}" in message


def test_the_back_off_is_capped():
    rb = build(QuotaReplayBuffer, lambda n: 0, poll_interval=1.0, refill_backoff_max_seconds=2.5)
    waits = [min(rb.batching.refill_backoff_max_seconds, rb.poll_interval * 2 ** (k - 1)) for k in (1, 2, 3, 4)]
    assert waits == [1.0, 2.0, 2.5, 2.5]
    with pytest.raises(ValueError, match=r"max_empty_refills=0; must be an int >= 1"):
        BatchingConfig.from_sampler_kwargs({"max_empty_refills": 0})
    with pytest.raises(ValueError, match=r"refill_backoff_max_seconds=-1; must be a finite number >= 0"):
        BatchingConfig.from_sampler_kwargs({"refill_backoff_max_seconds": -1})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(empty=st.integers(0, 6), limit=st.integers(1, 5), mode=st.sampled_from(SAMPLERS))
def test_a_refill_that_comes_back_before_the_bound_is_served(clean, empty, limit, mode):
    """``empty`` empty refills, then one that yields: served iff empty < max_empty_refills, and the
    refill is called exactly as often as needed (the bound counts empty refills in a row only)."""
    for partition, items in (clean.kv_list() or {}).items():
        if items:
            clean.kv_clear(keys=list(items), partition_id=partition)
    cls, trainer_mode = mode
    write_group(clean, "m", [1.0, -1.0], domain="mobile")
    refill = Refill(clean, after=empty)
    rb = build(cls, refill, trainer_mode, max_empty_refills=limit)
    if empty < limit:
        batch, _ = rb.sample(1, "train", 2)
        assert {k.split("_")[0] for k in batch.keys} == {"m", f"r{empty + 1}"}
        assert len(refill.calls) == empty + 1
    else:
        with pytest.raises(RuntimeError, match=f"yielded no prompt {limit} times in a row"):
            rb.sample(1, "train", 2)
        assert len(refill.calls) == limit

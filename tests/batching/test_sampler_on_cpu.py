"""The quota samplers run inside verl's real ReplayBuffer code against an in-memory TransferQueue."""

import types
from collections import Counter

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import verl.trainer.ppo.v1.replay_buffer as verl_rb
from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
from verl.trainer.ppo.v1.trainer_base import PPOTrainer
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories
from verl_mopd.batching import sampler as qs
from verl_mopd.batching.sampler import BatchingConfig, QuotaReplayBuffer, QuotaReplayBufferAsync

from .memory_tq import Domain, World

SHARES = {"mobile": 0.5, "desktop": 0.5}


def make_world(monkeypatch, domains, mix=("mobile", "desktop"), **kw):
    world = World(domains, mix, **kw)
    monkeypatch.setattr(verl_rb, "tq", world.tq)
    monkeypatch.setattr(qs, "tq", world.tq)
    return world


def kwargs(**over):
    base = {"quota": {"shares": SHARES, "max_wait_groups": 8}, "train_batch_size": 8, "max_inflight_gen_batches": 2}
    base.update(over)
    return OmegaConf.create(base)


def build(cls, world, sampler_kwargs, mode="sync", **kw):
    return cls(
        trainer_mode=mode,
        trainer_config=OmegaConf.create({}),
        max_off_policy_threshold=None if mode == "sync" else 4,
        max_off_policy_strategy="drop",
        sampler_kwargs=sampler_kwargs,
        poll_interval=0.0,
        refill_fn=world.submit,
        clock=lambda: float(world.now),
        **kw,
    )


def test_built_by_verls_trainer_from_custom_sampler_config(monkeypatch):
    world = make_world(monkeypatch, [Domain("mobile", 1, 1.0), Domain("desktop", 1, 1.0)])
    cfg = OmegaConf.create(
        {
            "data": {"train_batch_size": 8},
            "trainer": {
                "v1": {
                    "trainer_mode": "sync",
                    "sync": {},
                    "sampler": {
                        "max_off_policy_threshold": None,
                        "max_off_policy_strategy": "drop",
                        "custom_sampler": {"path": "pkg://verl_mopd.batching.sampler", "name": "QuotaReplayBuffer"},
                        "sampler_kwargs": {
                            "quota": {"shares": SHARES, "max_wait_groups": 8},
                            "train_batch_size": "${data.train_batch_size}",
                        },
                    },
                }
            },
        }
    )
    fake = types.SimpleNamespace(config=cfg, trainer_mode="sync", _add_prompts_to_generate=world.submit)
    rb = PPOTrainer._build_replay_buffer(fake)
    assert isinstance(rb, QuotaReplayBuffer)
    assert rb.batching.train_batch_size == 8 and rb.batching.quota.shares == SHARES


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="uniform_groups='keep'"):
        BatchingConfig.from_sampler_kwargs(kwargs(uniform_groups="keep"))
    with pytest.raises(ValueError, match=r"unknown .*\['quotas'\]"):
        BatchingConfig.from_sampler_kwargs({"quotas": {}})
    with pytest.raises(ValueError, match="sums to"):
        BatchingConfig.from_sampler_kwargs({"quota": {"shares": {"mobile": 0.5, "desktop": 0.6}}})
    with pytest.raises(ValueError, match="train_batch_size is required"):
        build(QuotaReplayBuffer, types.SimpleNamespace(submit=lambda n: n, now=0), kwargs(train_batch_size=None))


def _run_sync(world, rb, steps, batch_size):
    shares, fallbacks, metrics = Counter(), 0, []
    for step in range(steps):
        world.global_steps = step + 1
        world.submit(batch_size)
        batch, m = rb.sample(step + 1, "train", batch_size)
        uids = {k.split("_")[0] for k in batch.keys}
        assert len(uids) == batch_size
        metrics.append(m)
        for d in SHARES:
            shares[d] += m[f"batching/{d}/accepted_share"] * batch_size
        fallbacks = m["batching/fallback_slots_cum"]
        world.tq.kv_clear(keys=batch.keys, partition_id="train")
        assert not world.inflight and not [k for k in world.tq.tags["train"]], "sync sampler must be bufferless"
    return shares, fallbacks, metrics


def test_sync_quota_holds_the_mix_where_verl_dapo_drifts(monkeypatch):
    domains = [Domain("mobile", 1, 0.8), Domain("desktop", 3, 0.2)]
    world = make_world(monkeypatch, domains, seed=1)
    rb = build(QuotaReplayBuffer, world, kwargs(quota={"shares": SHARES, "max_wait_groups": 64}))
    shares, fallbacks, _ = _run_sync(world, rb, steps=6, batch_size=8)
    assert shares == {"mobile": 24, "desktop": 24} and fallbacks == 0

    world = make_world(monkeypatch, domains, seed=1)
    plain = verl_rb.ReplayBuffer(
        "sync", OmegaConf.create({}), None, "drop", OmegaConf.create({}), poll_interval=0.0, refill_fn=world.submit,
        filter_groups_metric="reward", train_batch_size=8, gen_batch_size=1, max_inflight_gen_batches=2,
    )
    mix = Counter()
    for step in range(6):
        world.global_steps = step + 1
        world.submit(8)
        batch, _ = plain.sample(step + 1, "train", 8)
        uids = {k.split("_")[0] for k in batch.keys}
        mix.update(world.tq.fields["train"][f"{u}_0_0"]["platform"] for u in uids)
        world.tq.kv_clear(keys=batch.keys, partition_id="train")
    assert mix["mobile"] > 1.5 * mix["desktop"]  # the drift the quota removes


def test_sync_fallback_bounds_a_domain_that_supplies_nothing(monkeypatch):
    world = make_world(monkeypatch, [Domain("mobile", 1, 1.0), Domain("desktop", 1, 0.0)], seed=2)
    rb = build(QuotaReplayBuffer, world, kwargs(quota={"shares": SHARES, "max_wait_groups": 6}))
    shares, fallbacks, metrics = _run_sync(world, rb, steps=3, batch_size=8)
    assert shares == {"mobile": 24, "desktop": 0}
    assert fallbacks == 12
    assert all(m["batching/fallback_slots"] == 4 for m in metrics)
    assert all(m.get("batching/desktop/groups_dropped_uniform", 0) > 0 for m in metrics)


def test_env_failures_leave_the_batch_and_grpo_stats(monkeypatch):
    world = make_world(monkeypatch, [Domain("mobile", 1, 1.0), Domain("desktop", 1, 1.0)])
    rb = build(QuotaReplayBuffer, world, kwargs(quota={"shares": SHARES, "max_wait_groups": 64}, train_batch_size=2))
    # mobile: the env-failed sample would make the group mixed; without it the group is uniform -> dropped.
    world.write_group("a", "mobile", [1.0, 1.0, 1.0, -1.0], [False, False, False, True])
    # mobile: one failure, the rest is mixed -> kept with 3 samples.
    world.write_group("b", "mobile", [1.0, -0.5, 1.0, -1.0], [False, False, False, True])
    # desktop: only one valid sample left -> dropped.
    world.write_group("c", "desktop", [1.0, -1.0, -1.0, -1.0], [False, True, True, True])
    world.write_group("d", "desktop", [1.0, -1.0, -0.5, 1.0], [False] * 4)
    batch, m = rb.sample(1, "train", 2)
    assert sorted(batch.keys) == ["b_0_0", "b_1_0", "b_2_0", "d_0_0", "d_1_0", "d_2_0", "d_3_0"]
    assert "b_3_0" not in world.tq.fields["train"], "masked trajectory must be cleared"
    assert m["batching/env_failure/masked_samples"] == 1
    assert m["batching/mobile/groups_dropped_uniform"] == 1 and m["batching/desktop/groups_dropped_too_few_valid"] == 1
    assert m["batching/env_failure/samples"] == 5

    # verl's own v1 GRPO on the materialized batch uses the valid samples only.
    data = world.tq.kv_batch_get(batch.keys, "train", ["rm_scores", "uid"])
    rewards = torch.stack([r for r in data["rm_scores"]])
    dp = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": torch.ones_like(rewards)},
        non_tensors={"uid": np.array([k.split("_")[0] for k in batch.keys], dtype=object)},
    )
    out = compute_advantage_for_multi_trajectories(dp, batch.keys, "grpo", num_repeat=4)
    b_scores = torch.tensor([1.0, -0.5, 1.0], dtype=torch.float64)
    expected_b = (b_scores - b_scores.mean()) / (b_scores.std() + 1e-6)
    torch.testing.assert_close(out.batch["advantages"][:3, -1].double(), expected_b, rtol=1e-5, atol=1e-5)


def test_kl_only_keeps_uniform_groups_counted_apart(monkeypatch):
    world = make_world(monkeypatch, [Domain("mobile", 1, 1.0), Domain("desktop", 1, 1.0)])
    rb = build(
        QuotaReplayBuffer, world,
        kwargs(quota={"shares": SHARES, "max_wait_groups": 64}, train_batch_size=2, uniform_groups="kl_only",
               kl_only_max_score=0.0),
    )
    world.write_group("a", "mobile", [-1.0] * 4, [False] * 4)  # all failure: teacher signal, kept
    world.write_group("s", "mobile", [1.0] * 4, [False] * 4)  # all success: gate would mask KL, dropped
    world.write_group("d", "desktop", [1.0, -1.0, -0.5, 1.0], [False] * 4)
    batch, m = rb.sample(1, "train", 2)
    assert {k.split("_")[0] for k in batch.keys} == {"a", "d"}
    assert m["batching/mobile/accepted_kl_only_groups"] == 1 and m["batching/desktop/accepted_valid_groups"] == 1
    assert m["batching/mobile/groups_dropped_uniform"] == 1
    adv, _ = compute_grpo_outcome_advantage(
        torch.tensor([[0.0, -1.0]] * 4), torch.ones(4, 2), np.array(["a"] * 4, dtype=object)
    )
    assert torch.count_nonzero(adv) == 0  # a kept uniform group gets advantage 0 from verl's GRPO


def test_async_buffers_surplus_and_checkpoint_roundtrip(monkeypatch, tmp_path):
    world = make_world(monkeypatch, [Domain("mobile", 1, 1.0), Domain("desktop", 3, 1.0)], seed=3)
    rb = build(QuotaReplayBufferAsync, world, kwargs(quota={"shares": SHARES, "max_wait_groups": 64}), mode="separate_async")
    world.submit(16)
    seen = set()
    for step in range(1, 4):
        world.global_steps = step
        batch, m = rb.sample(step, "train", 4)
        uids = {k.split("_")[0] for k in batch.keys}
        assert len(uids) == 4 and not uids & seen
        seen |= uids
        assert m["batching/mobile/accepted_share"] == 0.5
        world.tq.kv_clear(keys=batch.keys, partition_id="train")
        world.submit(4)
    assert rb.get_sampleable_count(4, "train") > 0  # surplus stays buffered
    rb.save_checkpoint(str(tmp_path / "global_step_3"))
    fresh = build(QuotaReplayBufferAsync, world, kwargs(quota={"shares": SHARES, "max_wait_groups": 64}), mode="separate_async")
    assert fresh.load_checkpoint(str(tmp_path / "global_step_3"))
    assert fresh.state_dict() == rb.state_dict() and fresh.scheduler.batches_total == 3
    other = build(QuotaReplayBufferAsync, world, kwargs(quota={"shares": {"mobile": 0.25, "desktop": 0.75}}), mode="separate_async")
    with pytest.raises(ValueError, match="resume with the same shares"):
        other.load_checkpoint(str(tmp_path / "global_step_3"))

"""Recipe checks that verl makes only once the trainer and its pools exist (separate-async asserts,
processes per GPU on the actor's pool), and the stage-2 recipe's memory and checkpoint settings."""

import pathlib

import pytest
from verl.utils.config import omega_conf_to_dataclass

from verl_mopd.checks.recipe_cli import compose_recipe
from verl_mopd.checks.validate import validate

STAGE2 = pathlib.Path(__file__).parents[2] / "recipes" / "ui_mopd" / "stage2_mopd_qwen3vl8b.yaml"
SEPARATE = ["trainer.v1.trainer_mode=mopd_separate_async",
            "trainer.v1.sampler.custom_sampler.name=QuotaReplayBufferAsync"]


def _problems(overrides):
    return "\n".join(validate(compose_recipe(str(STAGE2), overrides))[0])


def test_separate_async_needs_what_verls_constructor_asserts():
    problems = _problems(SEPARATE)
    assert "128 != 4 * 128" in problems and "parameter_sync_step=1" in problems
    assert "actor_rollout_ref.rollout.nnodes > 0" in problems
    assert "checkpoint_engine.backend=naive" in problems
    fixed = _problems([*SEPARATE, "trainer.v1.separate_async.parameter_sync_step=1", "actor_rollout_ref.rollout.nnodes=1",
                       "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"])
    assert "separate_async" not in fixed, fixed


@pytest.mark.parametrize("overrides, sharing", [
    ([], None),  # actor + two colocated teachers: exactly the 3 slots
    (["reward.reward_model.enable=true"], "reward model"),
    (["+mopd.teachers.web={model_path: /m, backend: megatron, placement: colocated, n_gpus_per_node: 8, "
      "nnodes: 8, tensor_model_parallel_size: 8}"], "teacher web"),
])
def test_processes_sharing_the_actors_gpus_fit_verls_colocate_count(overrides, sharing):
    problems = _problems(overrides)
    if sharing is None:
        assert "processes per GPU" not in problems
    else:
        assert "runs 3 processes per GPU" in problems and sharing in problems
    assert "4 share it" in problems or sharing is None
    dedicated = _problems([*overrides, "mopd.teachers.mobile.placement=dedicated", "trainer.nnodes=16"])
    assert "processes per GPU" not in dedicated


def test_stage2_recipe_carries_the_release_memory_and_checkpoint_settings():
    cfg = compose_recipe(str(STAGE2))
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # verl's own McoreActorConfig
    otc = actor.megatron.override_transformer_config
    assert (otc["recompute_granularity"], otc["recompute_method"], otc["recompute_num_layers"]) == ("full", "uniform", 1)
    assert actor.use_fused_kernels and cfg.actor_rollout_ref.model.use_fused_kernels
    assert actor.optim.use_precision_aware_optimizer
    assert actor.optim.override_optimizer_config == {"optimizer_cpu_offload": True, "optimizer_offload_fraction": 1.0,
                                                     "overlap_cpu_optimizer_d2h_h2d": True}
    assert list(actor.checkpoint.save_contents) == ["model", "optimizer", "extra"]
    assert list(actor.checkpoint.load_contents) == ["model", "optimizer", "extra"]
    assert cfg.trainer.max_actor_ckpt_to_keep == 2
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)  # verl's RolloutConfig
    assert (rollout.max_num_seqs, rollout.multi_stage_wake_up, rollout.agent.num_workers) == (1024, True, 64)
    assert cfg.data.val_batch_size == 128

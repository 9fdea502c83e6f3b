"""The smoke profiles change only sizes, devices, engines and paths of the recipes they are composed on.

``verl-mopd smoke`` runs the shipped recipes with ``+smoke=<profile>``; whatever the smoke proves is
proved for the recipe only if the profile leaves the method alone. Every key the profile changes
must be one of the patterns below, and the method keys must not change at all.
"""

import fnmatch
import os
import pathlib
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.utils.config import omega_conf_to_dataclass

from verl_mopd.testing.smoke import PROFILES
from verl_mopd.checks.validate import validate

RECIPES = pathlib.Path(__file__).parents[2] / "recipes" / "ui_mopd"

SIZES = [
    "data.train_batch_size", "data.val_batch_size", "data.max_prompt_length", "data.max_response_length",
    "data.micro_batch_size_per_gpu", "data.max_length", "data.max_token_len_per_gpu",
    "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "actor_rollout_ref.actor.rollout_n",
    "actor_rollout_ref.rollout.n", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.agent.num_workers", "reward.num_workers", "trainer.v1.sampler.sampler_kwargs.train_batch_size",
    "trainer.total_training_steps", "trainer.save_freq", "trainer.test_freq",
    # verl interpolates these from the sizes above
    "actor_rollout_ref.rollout.prompt_length", "actor_rollout_ref.rollout.response_length",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", "distillation.teacher_models.*.inference.prompt_length",
    "distillation.teacher_models.*.inference.response_length", "mopd.teachers.*.params_b",
]
DEVICES = [
    "trainer.device", "trainer.nnodes", "trainer.n_gpus_per_node", "mopd.teachers.*.device",
    "mopd.teachers.*.n_gpus_per_node", "mopd.teachers.*.nnodes", "mopd.teachers.*.placement",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units", "actor_rollout_ref.rollout.n_gpus_per_node",
    "ray_kwargs.ray_init.include_dashboard",
]
ENGINES = [
    "model_engine", "actor_rollout_ref.actor.*", "actor_rollout_ref.ref.*", "critic.*",
    "actor_rollout_ref.model.use_remove_padding", "actor_rollout_ref.model.use_fused_kernels",
    "actor_rollout_ref.model.override_config.*", "actor_rollout_ref.rollout.name",
    "actor_rollout_ref.rollout.tensor_model_parallel_size", "actor_rollout_ref.rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.enforce_eager", "actor_rollout_ref.rollout.max_num_seqs",
    "actor_rollout_ref.rollout.multi_stage_wake_up", "actor_rollout_ref.rollout.qat.*",
    "distillation.teacher_models.*.inference.name", "mopd.teachers.*.backend", "mopd.teachers.*.dtype",
    "mopd.teachers.*.weights",  # where the layout keeps a teacher's weights between steps (unset: auto)
    "mopd.teachers.*.tensor_model_parallel_size", "reward.reward_model.*", "engine.*", "optim.*",
    "model.use_remove_padding", "model.override_config.*",
]
OUTPUTS = ["trainer.logger"]  # where the metrics go (verl's file logger for the smoke's checks)
#: what the smoke's checks need changed, and why (recipes/ui_mopd/smoke/_stage2.yaml says the same)
CHECKS = {
    # the tiny student moves past the rollout check's tolerance at each step (at the recipe's 1e-6 it moves
    # 0.0013 in probability): a rollout left on old weights then fails that check
    "actor_rollout_ref.actor.optim.lr": 5.0e-4,
}
#: the method: the profile must leave every one of these exactly as the recipe has it
METHOD = [
    "algorithm.*", "reward.custom_reward_function.*", "distillation.distillation_loss.*", "distillation.enabled",
    "distillation.teacher_key", "mopd.enable",
    "mopd.tau_kl", "mopd.gate_metric", "mopd.group_key", "mopd.normalization", "mopd.routing_key",
    "mopd.kl_skip_thought", "trainer.v1.trainer_mode", "trainer.v1.sampler.custom_sampler.*",
    "trainer.v1.sampler.sampler_kwargs.quota.*", "trainer.v1.sampler.sampler_kwargs.uniform_groups",
    "trainer.v1.sampler.sampler_kwargs.filter_metric", "trainer.v1.sampler.sampler_kwargs.kl_only_max_score",
    "actor_rollout_ref.actor.clip_ratio*", "actor_rollout_ref.actor.loss_agg_mode",
    "actor_rollout_ref.actor.entropy_coeff", "actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.ppo_epochs",
    "actor_rollout_ref.actor.policy_loss.*", "actor_rollout_ref.actor.optim.weight_decay",
    "actor_rollout_ref.actor.optim.lr_warmup_steps", "actor_rollout_ref.actor.checkpoint.save_contents",
    "actor_rollout_ref.rollout.temperature", "actor_rollout_ref.rollout.top_p", "actor_rollout_ref.rollout.top_k",
    "actor_rollout_ref.rollout.calculate_log_probs", "actor_rollout_ref.rollout.mode",
    "data.truncation", "data.filter_overlong_prompts", "data.image_key", "data.messages_key", "data.pad_mode",
    "optim.lr", "optim.weight_decay", "optim.lr_warmup_steps_ratio", "model.path", "data.train_files",
    "mopd.teachers.*.model_path", "trainer.total_epochs",
]


def _flat(node, prefix=""):
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: node}


def _compose(recipe: str, overrides=()):
    with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
        return compose(config_name=recipe, overrides=list(overrides))


def _changes(recipe: str, profile: str) -> tuple[dict, dict]:
    base = _flat(OmegaConf.to_container(_compose(recipe), resolve=True))
    smoke = _flat(OmegaConf.to_container(_compose(recipe, [f"+smoke={profile}"]), resolve=True))
    changed = {k for k in set(base) | set(smoke) if base.get(k, "<absent>") != smoke.get(k, "<absent>")}
    return base, smoke, changed


def _matches(key: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns)


CASES = [(recipe, PROFILES[device].stage1 if "stage1" in recipe else PROFILES[device].stage2)
         for device in PROFILES
         for recipe in ("stage1_teacher_sft_desktop", "stage1_teacher_sft_mobile", "stage2_mopd_qwen3vl8b")]


@pytest.mark.parametrize("recipe, profile", CASES, ids=[f"{r}+{p}" for r, p in CASES])
def test_a_profile_changes_only_sizes_devices_engines_and_outputs(recipe, profile):
    base, smoke, changed = _changes(recipe, profile)
    unexpected = sorted(k for k in changed if not _matches(k, SIZES + DEVICES + ENGINES + OUTPUTS + list(CHECKS)))
    assert not unexpected, {k: (base.get(k), smoke.get(k)) for k in unexpected}
    method = sorted(k for k in changed if _matches(k, METHOD))
    assert not method, {k: (base.get(k), smoke.get(k)) for k in method}
    assert changed, "the profile changed nothing"
    assert {k: smoke[k] for k in changed & set(CHECKS)} == ({} if "stage1" in recipe else CHECKS)


@pytest.mark.parametrize("device", sorted(PROFILES))
def test_the_stage2_profile_validates_and_runs_the_teachers_the_smoke_checks(device):
    profile = PROFILES[device]
    cfg = _compose("stage2_mopd_qwen3vl8b", [f"+smoke={profile.stage2}"])
    env = profile.environment()
    if "verl_mopd.testing.cpu.megatron" in env.get("VERL_USE_EXTERNAL_MODULES", ""):
        # fp32 Megatron is the harness's (verl admits bfloat16 / float16): validated where the run is, with it
        done = subprocess.run([sys.executable, "-m", "verl_mopd.cli", "validate-recipe",
                               str(RECIPES / "stage2_mopd_qwen3vl8b.yaml"), f"+smoke={profile.stage2}"],
                              env={**os.environ, **env}, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        problems, _ = validate(cfg)
        assert problems and all("dtype float32 not supported" in p for p in problems), problems  # without it
    else:
        problems, _ = validate(cfg)
        assert problems == []
    assert {p: t.backend for p, t in cfg.mopd.teachers.items()} == profile.teacher_backends
    actor = cfg.actor_rollout_ref.actor
    assert actor.strategy.startswith(profile.actor_engine)
    assert (actor.megatron.tensor_model_parallel_size if profile.actor_engine == "megatron" else 1) == profile.actor_tp
    if "verl_mopd.testing.cpu.megatron" not in env.get("VERL_USE_EXTERNAL_MODULES", ""):
        omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # the swapped engine's own config class accepts it
    assert cfg.trainer.save_freq == 2 and cfg.trainer.total_training_steps == 3


#: the parallel sizes: the layouts' TP 8 (stage 1, the teachers) scaled to the 2 ranks of a CPU run
PARALLEL_SIZES = ["engine.tensor_model_parallel_size", "mopd.teachers.*.tensor_model_parallel_size"]
#: the rollout engine: the CPU harness's hf rollout stands in for SGLang (GPU-only); verl's teacher loop
#: block interpolates the rollout's name
ROLLOUT = ["actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.tensor_model_parallel_size",
           "distillation.teacher_models.*.inference.name"]
#: what the CPU cannot do as the GPU does, each for a reason: fp32 (the checks compare the engine with
#: transformers in fp32), and no Megatron CPU optimizer offload (its HybridDeviceOptimizer takes 16-bit
#: parameters only; an fp32 model's optimizer shards are views it refuses)
CPU_DEVICE = ["engine.dtype", "actor_rollout_ref.actor.megatron.dtype", "mopd.teachers.*.dtype",
              "actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload"]
#: verl interpolates these from the actor's sizes
DERIVED = ["actor_rollout_ref.ref.rollout_n", "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
           "critic.ppo_mini_batch_size", "critic.rollout_n"]


@pytest.mark.parametrize("recipe, profile", [("stage1_teacher_sft_desktop", "stage1_cpu"),
                                             ("stage1_teacher_sft_mobile", "stage1_cpu"),
                                             ("stage2_mopd_qwen3vl8b", "stage2_cpu")])
def test_the_megatron_cpu_profile_runs_the_recipes_own_layout(recipe, profile):
    """The default CPU smoke is the recipe's Megatron layout: only sizes, devices and the rollout engine change."""
    base, smoke, changed = _changes(recipe, profile)
    allowed = SIZES + DEVICES + PARALLEL_SIZES + ROLLOUT + CPU_DEVICE + DERIVED + OUTPUTS + list(CHECKS)
    unexpected = sorted(k for k in changed if not _matches(k, allowed))
    assert not unexpected, {k: (base.get(k), smoke.get(k)) for k in unexpected}
    if "stage1" in recipe:
        assert smoke["engine._target_"] == base["engine._target_"] == "verl.workers.config.McoreEngineConfig"
    else:
        assert smoke["actor_rollout_ref.actor.strategy"] == base["actor_rollout_ref.actor.strategy"] == "megatron"
    if "stage2" in recipe:
        assert smoke["actor_rollout_ref.actor.megatron.tensor_model_parallel_size"] == 2  # the recipe's student TP
        assert smoke["actor_rollout_ref.rollout.name"] == "hf" and base["actor_rollout_ref.rollout.name"] == "sglang"
        assert all(smoke[f"mopd.teachers.{p}.backend"] == "megatron" and smoke[f"mopd.teachers.{p}.placement"] ==
                   "colocated" for p in ("desktop", "mobile"))


def test_the_gpu_profile_differs_from_the_cpu_profile_only_in_gpu_only_parts():
    cpu = _flat(OmegaConf.to_container(_compose("stage2_mopd_qwen3vl8b", ["+smoke=stage2_cpu"]), resolve=True))
    gpu = _flat(OmegaConf.to_container(_compose("stage2_mopd_qwen3vl8b", ["+smoke=stage2_gpu"]), resolve=True))
    changed = sorted(k for k in set(cpu) | set(gpu) if cpu.get(k, "<absent>") != gpu.get(k, "<absent>"))
    assert all(_matches(k, DEVICES + ENGINES) for k in changed), [k for k in changed if not _matches(k, DEVICES + ENGINES)]
    assert cpu["actor_rollout_ref.rollout.name"] == "hf" and gpu["actor_rollout_ref.rollout.name"] == "sglang"
    assert cpu["actor_rollout_ref.actor.strategy"] == gpu["actor_rollout_ref.actor.strategy"] == "megatron"

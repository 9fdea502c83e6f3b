"""What the one-GPU smoke can be checked for without a GPU: its inputs build, its overrides compose
with verl's config and pass every recipe check, and its megatron teacher is configured from the run."""

import importlib.util
import pathlib

from hydra import compose, initialize_config_dir

import verl_mopd
from verl_mopd.trainer.validate import validate

ROOT = pathlib.Path(__file__).parents[2]
CONFIG_DIR = pathlib.Path(verl_mopd.__file__).parent / "trainer" / "config"


def _smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", ROOT / "scripts" / "gpu_smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_run_config_is_valid_and_builds_both_teachers(tmp_path):
    from verl_mopd.teachers.backends.megatron import training_worker_config
    from verl_mopd.trainer.mopd_trainer import teachers_config_from

    smoke = _smoke()
    smoke.build(tmp_path)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="mopd", overrides=smoke.overrides(tmp_path))
    problems, _ = validate(cfg)
    assert problems == []
    assert cfg.actor_rollout_ref.actor.strategy == "megatron" and cfg.trainer.total_training_steps == 3
    teachers = teachers_config_from(cfg)
    assert {p: t.backend for p, t in teachers.teachers.items()} == smoke.BACKENDS
    twc = training_worker_config(teachers.teachers["mobile"], cfg)
    assert twc.engine_config.forward_only and twc.engine_config.param_offload  # colocated on the actor's GPU
    reward = importlib.util.spec_from_file_location("r", cfg.reward.custom_reward_function.path)
    module = importlib.util.module_from_spec(reward)
    reward.loader.exec_module(module)
    accs = [module.smoke_score("d", "", "", {"index": i})["acc"] for i in range(8)]
    assert accs == [1.0, 1.0, 0.0, 0.0] * 2  # each step: per platform one group gated off, one on

"""verl_mopd.trainer.hooks: the public calls a verl v1 trainer makes to get MOPD."""

import os

import pytest
from hydra import compose, initialize_config_dir

import verl_mopd
from verl_mopd.config import MOPDConfig
from verl_mopd.demo.models import build_tokenizer
from verl_mopd.trainer import hooks, mopd_trainer

CONFIG_DIR = os.path.join(os.path.dirname(verl_mopd.__file__), "trainer", "config")
TINY = ["actor_rollout_ref.model.path=/tmp/not-loaded",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"]
#: verl's own teacher loop, declared only in verl's block
SERVER = ["distillation.enabled=true", "+distillation.teacher_models.a={key: a, model_path: /m/a}",
          "+distillation.teacher_models.b={key: b, model_path: /m/b}"]
WORKERS = ["+mopd.teachers={a: {model_path: /m/a}, b: {model_path: /m/b}}"]


def _compose(overrides=()):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="mopd", overrides=[*TINY, *overrides])


def test_set_verl_trainer_mode_returns_the_registered_name():
    cfg = _compose(["trainer.v1.trainer_mode=my_own"])
    assert hooks.set_verl_trainer_mode(cfg, "colocate_async") == "my_own"
    assert cfg.trainer.v1.trainer_mode == "colocate_async"
    with pytest.raises(ValueError, match=r"verl_mode='async'.*\['sync', 'separate_async', 'colocate_async'\]"):
        hooks.set_verl_trainer_mode(cfg, "async")


def test_think_end_token_id():
    tok = build_tokenizer(["</think> <answer> a"])
    assert hooks.think_end_token_id(tok, MOPDConfig()) is None  # kl_skip_thought off: tokenizer unused
    on = MOPDConfig(kl_skip_thought=True)
    assert hooks.think_end_token_id(tok, on) == tok.convert_tokens_to_ids("</think>")
    with pytest.raises(ValueError, match=r"mopd.think_end_token='</reasoning>' is not a single token"):
        hooks.think_end_token_id(tok, MOPDConfig(kl_skip_thought=True, think_end_token="</reasoning>"))


class _Trainer:
    def __init__(self, config):
        self.config, self.calls = config, []
        self.actor_rollout_wg = self

    def set_loss_fn(self, fn):
        self.calls.append(fn)


@pytest.mark.parametrize("overrides", [(), SERVER], ids=["no teachers", "verl's teacher loop"])
def test_no_worker_teachers_no_group_and_the_loss_left_to_verl(overrides):
    trainer = _Trainer(_compose(overrides))
    assert hooks.build_worker_teachers(trainer) is None
    assert hooks.setup_teachers_and_loss(trainer) is None and trainer.calls == []


def test_config_readers():
    cfg = _compose([*WORKERS, "mopd.tau_kl=0.3", "mopd.routing_key=task"])
    assert hooks.mopd_config_from(cfg).tau_kl == 0.3
    teachers = hooks.mopd_config_from(cfg)
    assert teachers.platforms == ["a", "b"] and teachers.routing_key == "task"
    verl_k3 = ["distillation.distillation_loss._target_=verl.workers.config.DistillationLossConfig",
               "distillation.distillation_loss.loss_mode=k3"]
    verl_k3 += [f"~distillation.distillation_loss.{k}"
                for k in ("k3_linear_above", "k3_clamp_below", "use_rollout_is_weights")]
    with pytest.raises(ValueError, match="loss_mode=mopd_k3, got 'k3'"):
        hooks.distillation_loss_fn(_compose(verl_k3))


def test_our_trainer_uses_the_public_hooks():
    assert score_teachers_is_public()
    for name in ("mopd_config_from", "distillation_loss_fn", "setup_teachers_and_loss",
                 "write_gate_and_teacher_logprobs", "set_verl_trainer_mode"):
        assert getattr(mopd_trainer, name) is getattr(hooks, name), name
    assert set(hooks.__all__) <= set(dir(hooks)), "hooks.__all__ names what hooks does not define"


def score_teachers_is_public() -> bool:
    return "score_teachers" in hooks.__all__ and "score_teachers" not in vars(mopd_trainer)

"""The MOPD v1 trainer hooks against verl's real trainer classes (TransferQueue in memory)."""

import dataclasses
import os

import pytest
import torch
from _tq_memory import InMemoryTQ
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tensordict import NonTensorStack, TensorDict
from verl.trainer.ppo.v1 import get_trainer_cls, trainer_base

import verl_mopd
from verl_mopd.batching.held import HELD_PROMPTS_FILE
from verl_mopd.config import MOPDConfig, MOPDDistillationLossConfig
from verl_mopd.trainer import mopd_trainer

CONFIG_DIR = os.path.join(os.path.dirname(verl_mopd.__file__), "trainer", "config")
TINY = [
    "actor_rollout_ref.model.path=/tmp/not-loaded",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.rollout.n=4",
    "algorithm.adv_estimator=grpo",
]


def compose_mopd(overrides=()):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="mopd", overrides=[*TINY, *overrides])


def test_yaml_defaults_equal_the_dataclass_defaults():
    cfg = compose_mopd()
    mopd = OmegaConf.to_container(cfg.mopd, resolve=True)
    fields = [f for f in dataclasses.fields(MOPDConfig) if not f.name.startswith("_")]
    assert sorted(mopd) == sorted(f.name for f in fields if f.name != "teachers"), "mopd_base.yaml vs MOPDConfig"
    for f in (f for f in fields if f.name != "teachers"):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        assert mopd[f.name] == default, f.name
    loss = OmegaConf.to_container(cfg.distillation.distillation_loss, resolve=True)
    for name in ("loss_mode", "use_policy_gradient", "loss_max_clamp", "log_prob_min_clamp",
                 "k3_linear_above", "k3_clamp_below", "use_rollout_is_weights"):
        assert loss[name] == MOPDDistillationLossConfig.__dataclass_fields__[name].default, name
    assert loss["distillation_loss_coef"] == 0.01  # beta has one name: verl's coefficient


def test_trainers_are_registered_by_name():
    for name in mopd_trainer.MOPD_TRAINER_MODES:
        assert issubclass(get_trainer_cls(name), mopd_trainer.MOPDTrainerMixin)


def test_trainer_keeps_verl_mode_semantics_and_rejects_unknown_mode():
    cfg = compose_mopd()
    trainer = mopd_trainer.MOPDTrainerSync(cfg)
    assert trainer.trainer_mode == "sync" and trainer.mopd_trainer_mode == "mopd_sync"
    assert type(trainer.replay_buffer).__name__ == "ReplayBuffer"
    with pytest.raises(ValueError, match="trainer.v1.trainer_mode='sync'"):
        mopd_trainer.MOPDTrainerSync(compose_mopd(["trainer.v1.trainer_mode=sync"]))


def _store_step(tq, n_groups=3, n=4):
    keys, rows = [], []
    for g in range(n_groups):
        for j in range(n):
            r = 3 + (g + j) % 3
            acc = float(g == 2 or (g == 1 and j == 0))  # group means 0, 0.25, 1
            keys.append(f"uid{g}_{j}_0")
            rows.append({
                "uid": f"uid{g}",
                "response_mask": torch.ones(r, dtype=torch.int64),
                "rm_scores": torch.nn.functional.pad(torch.tensor([1.0 if acc else -0.5]), (r - 1, 0)),
                "old_log_probs": -torch.rand(r),
                "platform": "mobile" if g == 0 else "desktop",
                "extra_fields": {"reward_extra_info": {"acc": acc}},
            })
    td = TensorDict(
        {k: (torch.nested.as_nested_tensor([r[k] for r in rows], layout=torch.jagged)
             if isinstance(rows[0][k], torch.Tensor) else NonTensorStack(*[r[k] for r in rows]))
         for k in rows[0]},
        batch_size=len(rows),
    )
    return tq.kv_batch_put(keys=keys, partition_id="train", fields=td, tags=[{"status": "success"}] * len(keys))


def test_compute_advantage_hook_writes_the_gate_then_runs_verl_grpo(monkeypatch):
    tq = InMemoryTQ()
    monkeypatch.setattr(trainer_base, "tq", tq)  # the client verl's trainer code calls
    trainer = mopd_trainer.MOPDTrainerSync(compose_mopd(["mopd.tau_kl=0.1"]))  # one success in 4 gates off
    batch = _store_step(tq)
    metrics = {}
    trainer._compute_advantage(batch, metrics)
    out = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["mopd_kl_mask", "advantages"])
    assert out["mopd_kl_mask"].tolist() == [1.0] * 4 + [0.0] * 8
    assert metrics["mopd/kl_mask_on_fraction/mobile"] == 1.0
    # verl's GRPO ran on the same samples: group 1 has one success -> non-zero advantages
    adv = out["advantages"].to_padded_tensor(0.0)
    assert adv[4:8].abs().sum() > 0 and adv[0:4].abs().sum() == 0  # all-equal group -> 0


def test_registration_check_fails_loudly(monkeypatch):
    trainer = mopd_trainer.MOPDTrainerSync(compose_mopd())
    monkeypatch.setattr(mopd_trainer, "_node_registration_report", lambda: [("node-a", True), ("node-b", False)])
    with pytest.raises(RuntimeError, match=r"not registered on Ray node\(s\) \['node-b'\]"):
        trainer.on_init_end()


def test_distillation_loss_fn_for_worker_backend_teachers():
    from verl_mopd.verl_loss import (
        distillation_ppo_loss_on_any_micro_batch as distillation_ppo_loss,  # verl's, any micro-batch
    )

    fn = mopd_trainer.distillation_loss_fn(compose_mopd())
    assert fn.func is distillation_ppo_loss
    assert fn.keywords["distillation_config"].distillation_loss.loss_mode == "mopd_k3"
    assert fn.keywords["distillation_config"].distillation_loss.distillation_loss_coef == 0.01
    import cloudpickle

    assert cloudpickle.loads(cloudpickle.dumps(fn)).func is distillation_ppo_loss  # set_loss_fn ships it


def test_teacher_logprobs_full_sequence_layout_round_trips_through_verl():
    from verl.workers.utils.padding import no_padding_2_padding

    prompt_lens, resp_lens = torch.tensor([3, 5, 2]), torch.tensor([4, 2, 6])
    resp = torch.randn(3, 6)
    from verl_mopd.teachers.layout import to_full_sequence

    full = to_full_sequence(resp, prompt_lens, resp_lens)
    data = TensorDict({
        "prompts": torch.nested.as_nested_tensor([torch.zeros(int(p)) for p in prompt_lens], layout=torch.jagged),
        "responses": torch.nested.as_nested_tensor([torch.zeros(int(r)) for r in resp_lens], layout=torch.jagged),
    }, batch_size=3)
    back = no_padding_2_padding(full, data).squeeze(-1)
    mask = torch.arange(6) < resp_lens[:, None]
    torch.testing.assert_close(back[mask], resp[mask])
    assert mopd_trainer.mopd_config_from(compose_mopd()).teachers == {}  # no teachers block in mopd.yaml


QUOTA = [
    "trainer.v1.sampler.custom_sampler.path=pkg://verl_mopd.batching.sampler",
    "trainer.v1.sampler.custom_sampler.name=QuotaReplayBuffer",
    "+trainer.v1.sampler.sampler_kwargs.quota={shares: {mobile: 0.5, desktop: 0.5}, max_wait_groups: 8}",
    "+trainer.v1.sampler.sampler_kwargs.train_batch_size=${data.train_batch_size}",
    "data.train_batch_size=4",
    "data.gen_batch_size=1",
]


def _prompt(i, platform):
    import numpy as np
    from verl.utils import tensordict_utils as tu

    return tu.get_tensordict({
        "raw_prompt": np.array([[{"role": "user", "content": f"p{i}"}]], dtype=object),
        "platform": np.array([platform], dtype=object),
        "uid": np.array([f"u{i}"], dtype=object),
    })


def _quota_trainer(monkeypatch, submitted):
    trainer = mopd_trainer.MOPDTrainerSync(compose_mopd(QUOTA))
    stream = iter([_prompt(i, p) for i, p in enumerate(["desktop", "mobile", "desktop", "mobile", "mobile"] * 4)])
    monkeypatch.setattr(trainer, "_fetch_one_gen_batch", lambda: next(stream))  # the dataloader
    trainer.global_steps = 1
    # verl's own submission (TransferQueue tags + agent loop), below our domain-aware one
    monkeypatch.setattr(trainer_base.PPOTrainer, "_submit_batch_to_rollout",
                        lambda self, b: submitted.append(b) or len(b))
    return trainer


def test_domain_aware_refill_holds_back_paused_domains(monkeypatch):
    from verl_mopd.batching.sampler import QuotaReplayBuffer

    submitted = []
    trainer = _quota_trainer(monkeypatch, submitted)
    assert isinstance(trainer.replay_buffer, QuotaReplayBuffer)
    paused = {"domains": frozenset({"desktop"})}
    monkeypatch.setattr(trainer.replay_buffer, "paused_domains", lambda: paused["domains"])

    assert trainer._add_prompts_to_generate(3) == 3
    assert [str(x) for x in list(submitted[-1]["platform"])] == ["mobile", "mobile", "mobile"]
    assert len(trainer.held_prompts.rows) == 2  # the two desktop prompts drawn on the way
    paused["domains"] = frozenset()
    trainer.global_steps = 5
    assert trainer._add_prompts_to_generate(2) == 2
    assert [str(x) for x in list(submitted[-1]["platform"])] == ["desktop", "desktop"]  # held ones first
    assert submitted[-1]["global_steps"] == 5  # drawn at step 1, submitted now: stamped with this step
    assert trainer.held_prompts.rows == []


def test_the_per_step_batch_is_domain_aware_too(monkeypatch):
    """verl's ``_add_batch_to_generate`` (train_batch_size prompts each step) goes through the same hold-back."""
    submitted = []
    trainer = _quota_trainer(monkeypatch, submitted)
    monkeypatch.setattr(trainer.replay_buffer, "paused_domains", lambda: frozenset({"mobile"}))
    trainer._add_batch_to_generate()  # verl's method, unchanged
    assert [str(x) for x in list(submitted[-1]["platform"])] == ["desktop"] * 4
    assert {str(list(r["platform"])[0]) for r in trainer.held_prompts.rows} == {"mobile"}


def _verl_checkpoint_part(monkeypatch, tmp_path):
    """verl's own part of ``_save_checkpoint`` / ``_load_checkpoint`` (the actor, the dataloader) left out:
    only its step folder and tracker file, under ``tmp_path``."""
    def verl_save(self):
        os.makedirs(tmp_path / f"global_step_{self.global_steps}", exist_ok=True)
        (tmp_path / "latest_checkpointed_iteration.txt").write_text(str(self.global_steps))

    def verl_load(self):
        self.global_steps = int((tmp_path / "latest_checkpointed_iteration.txt").read_text())

    monkeypatch.setattr(trainer_base.PPOTrainer, "_save_checkpoint", verl_save)
    monkeypatch.setattr(trainer_base.PPOTrainer, "_load_checkpoint", verl_load)


def test_held_prompts_survive_a_checkpoint(monkeypatch, tmp_path):
    submitted = []
    trainer = _quota_trainer(monkeypatch, submitted)
    monkeypatch.setattr(trainer.replay_buffer, "paused_domains", lambda: frozenset({"desktop"}))
    trainer._add_prompts_to_generate(3)
    held = [str(list(r["uid"])[0]) for r in trainer.held_prompts.rows]
    assert held

    _verl_checkpoint_part(monkeypatch, tmp_path)
    monkeypatch.setattr(trainer.replay_buffer, "save_checkpoint", lambda folder: None)
    trainer.config.trainer.default_local_dir = str(tmp_path)
    trainer._save_checkpoint()

    resumed = _quota_trainer(monkeypatch, [])
    monkeypatch.setattr(resumed.replay_buffer, "load_checkpoint", lambda folder: None)
    resumed.config.trainer.default_local_dir = str(tmp_path)
    resumed._load_checkpoint()
    assert [str(list(r["uid"])[0]) for r in resumed.held_prompts.rows] == held


def test_our_state_is_in_the_step_folder_before_verl_marks_the_step_latest(monkeypatch, tmp_path):
    """verl's real ``_save_checkpoint`` writes ``latest_checkpointed_iteration.txt`` last; when it
    does, ``batching_state.json`` and the held prompts must already be in ``global_step_N/`` (a
    crash in between must not leave a latest step without them)."""
    import builtins

    trainer = _quota_trainer(monkeypatch, [])
    monkeypatch.setattr(trainer.replay_buffer, "paused_domains", lambda: frozenset({"desktop"}))
    trainer._add_prompts_to_generate(3)
    trainer.config.trainer.default_local_dir = str(tmp_path)
    trainer.global_steps = 7

    class Actor:  # the actor worker group's save (verl writes actor/ before the tracker)
        def save_checkpoint(self, local_path, remote_path, step, max_ckpt_to_keep=None):
            os.makedirs(local_path)

    trainer.actor_rollout_wg = Actor()
    dataloader = type("DL", (), {"state_dict": lambda self: {}})()
    monkeypatch.setattr(trainer, "train_dataloader", dataloader, raising=False)
    seen = {}

    def spy_open(path, *args, **kwargs):
        if str(path).endswith("latest_checkpointed_iteration.txt"):
            seen["at_tracker_write"] = sorted(os.listdir(tmp_path / "global_step_7"))
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(trainer_base, "open", spy_open, raising=False)  # verl's module-level `open`
    trainer._save_checkpoint()
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "7"
    assert {"batching_state.json", HELD_PROMPTS_FILE, "actor", "data.pt"} <= set(
        seen["at_tracker_write"])
    assert len(torch.load(tmp_path / "global_step_7" / HELD_PROMPTS_FILE, weights_only=False)) == len(
        trainer.held_prompts.rows) > 0


def test_resume_reloads_the_samplers_state_through_its_own_save_and_load(monkeypatch, tmp_path):
    """The trainer's ``_save_checkpoint`` / ``_load_checkpoint`` with the quota sampler's real
    ``save_checkpoint`` / ``load_checkpoint`` (only verl's own part, the actor and the dataloader, is left
    out): the resumed sampler's counters are the saved ones, not a fresh sampler's."""
    trainer = _quota_trainer(monkeypatch, [])
    scheduler = trainer.replay_buffer.scheduler
    for batch in range(3):  # three batches served, 2 groups of each domain in each
        scheduler.start_batch(4, float(batch))
        for i, domain in enumerate(["desktop", "mobile", "desktop", "mobile"]):
            scheduler.add(f"g{batch}.{i}", domain)
        assert scheduler.poll(float(batch)).batch
    saved = trainer.replay_buffer.state_dict()
    fresh = _quota_trainer(monkeypatch, []).replay_buffer.state_dict()
    assert saved != fresh and saved["scheduler"]["batches_total"] == 3

    _verl_checkpoint_part(monkeypatch, tmp_path)
    trainer.config.trainer.default_local_dir = str(tmp_path)
    trainer.global_steps = 2
    trainer._save_checkpoint()

    resumed = _quota_trainer(monkeypatch, [])
    resumed.config.trainer.default_local_dir = str(tmp_path)
    resumed._load_checkpoint()
    assert resumed.global_steps == 2
    assert resumed.replay_buffer.state_dict() == saved

"""Your own verl v1 trainer with MOPD added through verl-mopd's public hooks.

``MyMOPDTrainer`` stands for the trainer you already have: a subclass of verl's
``PPOTrainerSync`` registered with verl's ``register_trainer`` and selected with
``trainer.v1.trainer_mode=my_mopd_sync``. It keeps everything of verl (rollout, rewards, GRPO,
the actor update) and adds four calls from ``verl_mopd.trainer.hooks``, the same ones our own
``mopd_sync`` trainer makes:

1. ``__init__``: keep verl's ``sync`` semantics under its own trainer name (verl's base class
   branches on the mode *name*), and read the ``mopd.*`` gate keys (``tau_kl``, ``gate_metric``, ...).
2. ``on_init_end``: build the teachers that run as verl worker groups (``backend: hf`` or
   ``megatron``; one per routing value) and give the actor verl's ``distillation_ppo_loss`` with
   ``loss_mode=mopd_k3`` through ``set_loss_fn``. With verl's own teacher loop instead
   (``distillation.teacher_models``) its servers score during rollout and verl's worker builds that loss itself: nothing to do.
3. ``_compute_advantage``, before verl's: ``reward_gate`` over the whole step batch (whole GRPO
   groups, which only the driver sees), stored per sample as ``mopd_kl_mask``; then the worker
   teachers score the samples whose KL is on and store ``teacher_logprobs``.

verl's TaskRunner (a Ray actor) looks the trainer up by name, so this module must be imported in
that process: ``register`` is the Ray ``worker_process_setup_hook`` in ``my_mopd.yaml``; in your
own package declare a ``verl.plugins`` entry point instead, as verl-mopd does.
"""

from __future__ import annotations

from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer

from verl_mopd.trainer import hooks

TRAINER_NAME = "my_mopd_sync"


class MyMOPDTrainer(PPOTrainerSync):
    """verl's synchronous v1 trainer + MOPD (reward gate, platform teachers, ``mopd_k3`` loss)."""

    def __init__(self, config):
        hooks.set_verl_trainer_mode(config, "sync")  # else verl would treat "my_mopd_sync" as async
        super().__init__(config)
        self.mopd_config = hooks.mopd_config_from(config)
        self.mopd_teachers = None

    def on_init_end(self):
        self.mopd_teachers = hooks.setup_teachers_and_loss(self)
        super().on_init_end()  # verl's: push the (possibly resumed) weights to the rollout replicas

    def _compute_advantage(self, batch, metrics):
        metrics.update(hooks.write_gate_and_teacher_logprobs(self, batch, self.mopd_config, self.mopd_teachers))
        return super()._compute_advantage(batch, metrics)


def register() -> None:
    """Register ``my_mopd_sync`` with verl's trainer registry (idempotent; runs on import)."""
    register_trainer(TRAINER_NAME)(MyMOPDTrainer)


register()

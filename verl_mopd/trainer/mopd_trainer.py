"""verl 0.9.1 v1 trainers with the MOPD hooks: reward gate, worker-backend teachers, metrics.

Thin subclasses of verl's own ``PPOTrainerSync`` / ``PPOTrainerSeparateAsync`` /
``PPOTrainerColocateAsync``, registered with verl's ``register_trainer`` as ``mopd_sync``,
``mopd_separate_async`` and ``mopd_colocate_async`` and selected with
``trainer.v1.trainer_mode``. Everything else (rollout, rewards, GRPO, the actor update) is verl's.

What the hooks add, per ``_step_once`` batch (whole GRPO groups, on the driver):

1. ``_compute_advantage``: after rewards and ``old_log_probs`` are stored and before the actor
   update, write ``mopd_kl_mask`` (``verl_mopd.trainer.gate``); with worker-backend teachers,
   score the samples whose KL is on with their platform's teacher and store ``teacher_logprobs``;
   then verl's own advantage computation.
2. ``on_init_end``: check that ``mopd_k3`` is registered in the driver and on every Ray node
   (verl hides plugin import failures); with worker-backend teachers, build the teacher group and
   give the actor verl's ``distillation_ppo_loss`` with our loss config through ``set_loss_fn``
   (``distillation.enabled`` stays false there, so verl starts no teacher servers).

Both hooks are the public calls of ``verl_mopd.trainer.hooks``, which any verl v1 trainer can make
(``examples/custom_trainer``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from omegaconf import DictConfig
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from verl_mopd.batching.held import HeldPrompts
from verl_mopd.verl_loss import MOPD_LOSS_MODE, require_registered
from verl_mopd.trainer.hooks import (  # noqa: F401  (the config readers stay importable from here)
    ROLLOUT_SYNC_LOG_ENV,
    STEP_DUMP_ENV,
    distillation_loss_fn,
    dump_actor_state,
    dump_step,
    mopd_config_from,
    set_verl_trainer_mode,
    setup_teachers_and_loss,
    write_gate_and_teacher_logprobs,
)

# verl_mopd.config and .gate are imported where used: this module is imported by register() while
# `import verl` runs (the verl.plugins entry point), possibly from inside verl_mopd.config's own
# first `import verl`, so importing it here would be circular.

logger = logging.getLogger(__name__)

#: our trainer_mode -> the verl trainer_mode whose semantics it keeps
MOPD_TRAINER_MODES = {
    "mopd_sync": "sync",
    "mopd_separate_async": "separate_async",
    "mopd_colocate_async": "colocate_async",
}


def _node_registration_report() -> list[tuple[str, bool]]:
    """Run ``import verl`` on every alive Ray node and report whether ``mopd_k3`` got registered."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)
    def probe():
        import socket

        import verl  # noqa: F401  (loads the verl.plugins entry points, as every verl worker does)
        from verl.trainer.distillation.losses import DISTILLATION_LOSS_REGISTRY

        return socket.gethostname(), MOPD_LOSS_MODE in DISTILLATION_LOSS_REGISTRY

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = [
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False)).remote()
        for n in nodes
    ]
    return ray.get(refs)


class MOPDTrainerMixin:
    """The MOPD hooks; combined with one of verl's v1 trainers below."""

    def __init__(self, config: DictConfig):
        requested = config.trainer.v1.trainer_mode
        if requested not in MOPD_TRAINER_MODES:
            raise ValueError(
                f"trainer.v1.trainer_mode={requested!r}: the MOPD trainers are {sorted(MOPD_TRAINER_MODES)}"
            )
        # verl's base trainer branches on trainer_mode ("sync" vs async); it selected this class by
        # name already, so from here on the run has verl's mode semantics.
        self.mopd_trainer_mode = set_verl_trainer_mode(config, MOPD_TRAINER_MODES[requested])
        self.mopd_config = mopd_config_from(config)  # the mopd block; an unknown key is an error here
        self.teacher_group = None
        self.held_prompts = HeldPrompts()  # drawn prompts of paused domains (domain-aware refill)
        super().__init__(config)

    # -- start-up checks ---------------------------------------------------------------------
    def on_init_end(self):
        require_registered("the trainer driver")
        report = _node_registration_report()
        missing = [host for host, ok in report if not ok]
        if missing:
            raise RuntimeError(
                f"loss_mode={MOPD_LOSS_MODE} is not registered on Ray node(s) {missing}: install verl-mopd "
                "in the environment of every node (the verl.plugins entry point registers it in each worker)"
            )
        # worker-backend teachers, and verl's distillation_ppo_loss for the actor (distillation.enabled
        # stays false: no verl teacher servers); server teachers are verl's own loop
        self.teacher_group = setup_teachers_and_loss(self)
        super().on_init_end()
        self._dump_actor_state()  # verl's on_init_end synced the rollout with the loaded weights

    # -- checkpoints: verl saves actor/critic/dataloader; the quota sampler's state and the held-back
    #    prompts (already drawn from verl's dataloader, so not in its data.pt) are ours ------------
    def _save_checkpoint(self):
        """Our state into ``global_step_N/`` first, then verl's save: verl's ``_save_checkpoint``
        writes ``latest_checkpointed_iteration.txt`` (the step a resume takes) as its last act, so
        a crash at any point never leaves a "latest" step without our files."""
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        os.makedirs(folder, exist_ok=True)
        if hasattr(self.replay_buffer, "save_checkpoint"):
            self.replay_buffer.save_checkpoint(folder)
        self.held_prompts.save(folder)
        super()._save_checkpoint()

    def _load_checkpoint(self):
        super()._load_checkpoint()
        folder = self._resumed_step_folder()
        if folder is None:
            return
        if hasattr(self.replay_buffer, "load_checkpoint"):
            self.replay_buffer.load_checkpoint(folder)
        self.held_prompts.load(folder)

    def _resumed_step_folder(self) -> str | None:
        """The ``global_step_N`` folder verl's ``_load_checkpoint`` resumed from (same rules), or None."""
        from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

        trainer = self.config.trainer
        if trainer.resume_mode == "disable" or self.global_steps == 0:
            return None
        if trainer.resume_mode == "resume_path":
            return os.path.abspath(trainer.resume_from_path)
        return find_latest_ckpt_path(os.path.abspath(trainer.default_local_dir))

    # -- domain-aware prompt draw (MintAct backpressure on the producer side) -----------------
    def _next_train_batch(self, num_prompts: int | None = None):
        """``num_prompts`` prompts for the rollout, holding back those of domains the quota sampler paused.

        verl draws every prompt it submits here: the per-step batch (``_add_batch_to_generate``)
        and every refill (``_add_prompts_to_generate``). Held prompts go first once their domain
        resumes; at most ``4 * num_prompts`` extra prompts are drawn; if every drawn prompt belongs to
        a paused domain, held ones are released anyway (the sampler's bounded-wait fallback then
        decides). The batch carries the current ``global_steps``, as verl's own draw does.
        """
        paused = getattr(self.replay_buffer, "paused_domains", None)
        gen_batch_size = self.config.data.get("gen_batch_size", None) or self.config.data.train_batch_size
        batch = self.held_prompts.next_batch(
            super()._next_train_batch, num_prompts or self.config.data.train_batch_size, gen_batch_size,
            frozenset(paused()) if paused else frozenset(),
            getattr(getattr(self.replay_buffer, "batching", None), "domain_key", None), self.global_steps)
        return super()._next_train_batch(num_prompts) if batch is None else batch  # nothing paused or held

    # -- per step ---------------------------------------------------------------------------
    def _compute_advantage(self, batch, metrics: dict[str, Any]):
        metrics.update(write_gate_and_teacher_logprobs(self, batch, self.mopd_config, self.teacher_group))
        batch = super()._compute_advantage(batch, metrics)
        if os.environ.get(STEP_DUMP_ENV):  # diagnostics of `verl-mopd smoke`: the step as the actor reads it
            from verl.trainer.ppo.v1 import trainer_base

            dump_step(batch, trainer_base.tq, os.environ[STEP_DUMP_ENV], routing_key=self.mopd_config.routing_key,
                      step=self.global_steps)
        return batch

    # -- diagnostics of `verl-mopd smoke`: the batching state at the start and end of every step ----
    def on_step_begin(self):
        super().on_step_begin()
        self._dump_batching_state("begin")

    def on_step_end(self):
        super().on_step_end()
        self._dump_batching_state("end")  # after verl's _save_checkpoint on a save step
        self._dump_actor_state()  # after the update and verl's weight sync of this step

    def _dump_actor_state(self) -> None:
        """With the smoke's hf rollout logging its syncs: the actor engine's own weights, for the smoke to
        compare with what the rollout holds (``hooks.dump_actor_state``)."""
        folder = os.environ.get(STEP_DUMP_ENV)
        if folder and os.environ.get(ROLLOUT_SYNC_LOG_ENV):
            dump_actor_state(self, folder)

    def _dump_batching_state(self, when: str) -> None:
        folder = os.environ.get(STEP_DUMP_ENV)
        if not folder:
            return
        import json

        state = self.replay_buffer.state_dict() if hasattr(self.replay_buffer, "state_dict") else None
        record = {"step": self.global_steps, "when": when, "sampler": state,
                  "held_prompts": [held_prompt_digest(row) for row in self.held_prompts.rows]}
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "batching_state.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")


def held_prompt_digest(row) -> str:
    """sha256 of a held prompt row (a one-row TensorDict): field names, tensor bytes, images' pixels and
    every other value's content (never an object's address), so a row reloaded from a checkpoint
    hashes as it did when it was saved."""
    import hashlib

    digest = hashlib.sha256()

    def feed(value) -> None:
        import numpy as np
        import torch

        if isinstance(value, torch.Tensor):
            value = value.detach().cpu()
            feed(("tensor", str(value.dtype), tuple(value.shape)))
            digest.update((value.to_padded_tensor(0) if value.is_nested else value).contiguous().numpy().tobytes())
        elif hasattr(value, "tobytes") and hasattr(value, "mode") and hasattr(value, "size"):  # a PIL image
            feed(("image", value.mode, tuple(value.size)))
            digest.update(value.tobytes())
        elif isinstance(value, np.ndarray):
            feed(value.tolist())
        elif isinstance(value, dict):
            digest.update(b"{")
            for key in sorted(value, key=str):
                feed(str(key))
                feed(value[key])
            digest.update(b"}")
        elif isinstance(value, list | tuple) or hasattr(value, "tolist"):
            items = value.tolist() if hasattr(value, "tolist") and not isinstance(value, list | tuple) else value
            digest.update(b"[")
            for item in items:
                feed(item)
            digest.update(b"]")
        else:
            digest.update(f"{type(value).__name__}:{value!r};".encode())

    for name in sorted(row.keys()):
        feed(name)
        feed(row[name])
    return digest.hexdigest()


@register_trainer("mopd_sync")
class MOPDTrainerSync(MOPDTrainerMixin, PPOTrainerSync):
    """verl's synchronous v1 trainer with the MOPD hooks."""


@register_trainer("mopd_separate_async")
class MOPDTrainerSeparateAsync(MOPDTrainerMixin, PPOTrainerSeparateAsync):
    """verl's separate-async v1 trainer with the MOPD hooks."""


@register_trainer("mopd_colocate_async")
class MOPDTrainerColocateAsync(MOPDTrainerMixin, PPOTrainerColocateAsync):
    """verl's colocate-async v1 trainer with the MOPD hooks."""

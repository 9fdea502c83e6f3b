"""The private verl methods verl-mopd overrides keep the signatures we were written against.

verl-mopd subclasses verl 0.9.1's v1 trainers, its replay buffers and its rollout base, and
overrides private methods (``_compute_advantage``, ``_next_train_batch``, ``_materialize_batch``,
...). A verl release may rename or reorder their parameters without notice; this test fails first,
naming the method, instead of a run failing (or silently skipping our override) on a cluster.

``PINNED`` is verl 0.9.1's parameter names per method. The second test finds every override by
introspection, so a new override must be pinned here too (tinker-cookbook's ``sig_helpers`` habit,
turned to face upstream).
"""

from __future__ import annotations

import importlib
import inspect

import pytest

#: the modules whose classes override verl's methods (testing.cpu.platform installs itself on import)
OVERRIDING_MODULES = [
    "verl_mopd.trainer.mopd_trainer",
    "verl_mopd.batching.sampler",
    "verl_mopd.testing.cpu.rollout",
]

PINNED = {
    "verl.base_config:BaseConfig.__init__": ["self", "_target_"],
    "verl.trainer.ppo.v1.replay_buffer:ReplayBuffer.__init__": [
        "self",
        "trainer_mode",
        "trainer_config",
        "max_off_policy_threshold",
        "max_off_policy_strategy",
        "sampler_kwargs",
        "poll_interval",
        "refill_fn",
        "filter_groups_metric",
        "train_batch_size",
        "gen_batch_size",
        "max_inflight_gen_batches",
        "sync_refill_failed_groups",
    ],
    "verl.trainer.ppo.v1.replay_buffer:ReplayBuffer._dapo_filtered_keys": ["self", "partition_id"],
    "verl.trainer.ppo.v1.replay_buffer:ReplayBuffer._materialize_batch": [
        "self",
        "partition_id",
        "selected_prompt_uids",
        "partition_snapshot",
    ],
    "verl.trainer.ppo.v1.replay_buffer:ReplayBuffer._sync_metadata_from_transfer_queue": ["self"],
    "verl.trainer.ppo.v1.replay_buffer:ReplayBuffer._select_prompt_uids": [
        "self",
        "partition_id",
        "sampleable_keys",
        "batch_size",
    ],
    "verl.trainer.ppo.v1.replay_buffer:ReplayBuffer._terminal_eviction_reasons": [
        "self",
        "global_steps",
        "partition_id",
    ],
    "verl.trainer.ppo.v1.replay_buffer:ReplayBufferAsync._has_enough_samples": [
        "self",
        "global_steps",
        "partition_id",
        "batch_size",
        "sampleable_keys",
    ],
    "verl.trainer.ppo.v1.replay_buffer:ReplayBufferAsync._terminal_eviction_reasons": [
        "self",
        "global_steps",
        "partition_id",
    ],
    "verl.trainer.ppo.v1.trainer_base:PPOTrainer.__init__": ["self", "config"],
    "verl.trainer.ppo.v1.trainer_base:PPOTrainer._compute_advantage": ["self", "batch", "metrics"],
    "verl.trainer.ppo.v1.trainer_base:PPOTrainer._load_checkpoint": ["self"],
    "verl.trainer.ppo.v1.trainer_base:PPOTrainer._next_train_batch": ["self", "num_prompts"],
    "verl.trainer.ppo.v1.trainer_base:PPOTrainer._save_checkpoint": ["self"],
    "verl.trainer.ppo.v1.trainer_separate_async:PPOTrainerSeparateAsync.__init__": ["self", "config"],
    "verl.workers.rollout.base:BaseRollout.__init__": [
        "self",
        "config",
        "model_config",
        "device_mesh",
        "args",
        "kwargs",
    ],
}


def _resolve(qualified: str):
    module, _, path = qualified.partition(":")
    owner, _, method = path.rpartition(".")
    return vars(getattr(importlib.import_module(module), owner))[method]


@pytest.mark.parametrize("qualified", sorted(PINNED))
def test_the_verl_method_we_override_has_the_pinned_signature(qualified):
    try:
        fn = _resolve(qualified)
    except (ImportError, AttributeError, KeyError) as exc:
        pytest.fail(f"verl no longer has {qualified} ({type(exc).__name__}: {exc}); verl-mopd overrides it")
    params = list(inspect.signature(fn).parameters)
    assert params == PINNED[qualified], (
        f"verl changed the signature of {qualified}: {params}, pinned {PINNED[qualified]}; "
        "check verl-mopd's override before updating the pin"
    )


def _overrides() -> set[str]:
    found = set()
    for name in OVERRIDING_MODULES:
        module = importlib.import_module(name)
        for cls in (c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == name):
            for method, fn in vars(cls).items():
                if (
                    not callable(fn)
                    or not method.startswith("_")
                    or (method.startswith("__") and method != "__init__")
                ):
                    continue
                for sub in (cls, *cls.__subclasses__()):
                    base = next(
                        (
                            b
                            for b in sub.__mro__
                            if b.__module__.startswith("verl.") and callable(vars(b).get(method))
                        ),
                        None,
                    )
                    if base is not None:
                        found.add(f"{base.__module__}:{base.__qualname__}.{method}")
                        break
    return found


def test_every_override_of_a_verl_method_is_pinned():
    unpinned = sorted(_overrides() - set(PINNED))
    assert not unpinned, f"verl-mopd overrides {unpinned}: pin their verl signatures in PINNED"

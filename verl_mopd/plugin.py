"""Registration of verl-mopd into verl's registries (the only global state we touch).

``register()`` is idempotent. It runs automatically in every process that imports verl through
the ``verl.plugins`` entry point declared in ``setup.py`` (``verl/__init__.py`` loads that group
unless ``VERL_USE_EXTERNAL_PLUGINS=none``); call it yourself in a custom trainer.
"""

from __future__ import annotations

MOPD_LOSS_MODE = "mopd_k3"


def register() -> None:
    """Register verl-mopd into verl's registries.

    - distillation loss mode ``mopd_k3`` (:func:`verl_mopd.losses.compute_mopd_k3`), through
      verl's ``register_distillation_loss`` with ``use_estimator=True`` (one log-prob per sampled
      token), so ``distillation.distillation_loss.loss_mode=mopd_k3`` selects it in any verl run;
    - the v1 trainers ``mopd_sync`` / ``mopd_separate_async`` / ``mopd_colocate_async``
      (``trainer.v1.trainer_mode``), through verl's ``register_trainer`` (importing
      ``verl_mopd.trainer.mopd_trainer`` does it; verl's TaskRunner looks them up by name).
    """
    from verl.trainer.distillation.losses import (
        DISTILLATION_LOSS_REGISTRY,
        DistillationLossSettings,
        register_distillation_loss,
    )

    from verl_mopd.losses import compute_mopd_k3

    registered = DISTILLATION_LOSS_REGISTRY.get(MOPD_LOSS_MODE)
    if registered is not None and registered is not compute_mopd_k3:
        raise RuntimeError(
            f"distillation loss mode {MOPD_LOSS_MODE!r} is already registered by "
            f"{registered.__module__}.{registered.__qualname__}, not by verl_mopd"
        )
    if registered is None:
        register_distillation_loss(DistillationLossSettings(names=[MOPD_LOSS_MODE], use_estimator=True))(
            compute_mopd_k3
        )
    import verl_mopd.trainer.mopd_trainer  # noqa: F401  (register_trainer on import)


def is_registered() -> bool:
    """Whether ``mopd_k3`` is in verl's distillation-loss registry (imports verl)."""
    from verl.trainer.distillation.losses import DISTILLATION_LOSS_REGISTRY

    return MOPD_LOSS_MODE in DISTILLATION_LOSS_REGISTRY


def require_registered(where: str = "this process") -> None:
    """Raise a clear error if ``mopd_k3`` is not registered (verl hides plugin failures)."""
    if not is_registered():
        import os

        raise RuntimeError(
            f"loss_mode={MOPD_LOSS_MODE} is not registered in {where}. verl loads it through the "
            "'verl.plugins' entry point of the verl-mopd package: check that verl-mopd is installed in "
            "this environment (pip install verl-mopd), that VERL_USE_EXTERNAL_PLUGINS "
            f"(now {os.getenv('VERL_USE_EXTERNAL_PLUGINS', 'auto')!r}) is 'auto' or lists 'verl_mopd', "
            "and look above for a 'verl-mopd plugin failed' warning."
        )

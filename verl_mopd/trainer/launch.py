"""The ``mopd`` block checked at launch on every hydra entry point, stock ``main_ppo`` included.

``mopd_base.yaml`` (which every verl-mopd recipe and ``mopd.yaml`` include) registers
:class:`CheckMopdBlock` under ``hydra.callbacks``. Hydra calls it in the launching process right
after composing the config and before the task function: before verl's ``main_ppo`` starts Ray. So
``python -m verl.trainer.main_ppo ... +mopd.tau_k1=0.5`` stops at once with
``mopd.tau_k1: unknown key; did you mean mopd.tau_kl?`` instead of training with the default tau,
or failing later inside a Ray actor. The trainers check the block again when they are built
(``hooks.mopd_config_from``), for a custom launcher that composes the config without hydra.

Reuses hydra's own ``Callback`` extension point; the check is ``MOPDConfig.from_mapping``.
"""

from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

__all__ = ["CheckMopdBlock"]


class CheckMopdBlock(Callback):
    """Hydra callback: build ``MOPDConfig`` from the composed ``mopd`` block; exit on a ``ConfigError``.

    Hydra turns an exception raised by a callback into a warning and runs the job anyway, so a bad
    block ends the process with ``SystemExit`` (its message on stderr, exit status 1), which hydra
    lets through.
    """

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        block = config.get("mopd", None)
        if block is None:
            return
        from verl_mopd.config import MOPDConfig
        from verl_mopd.errors import ConfigError

        try:
            MOPDConfig.from_mapping(block)
        except ConfigError as exc:
            raise SystemExit(f"verl-mopd: {exc}") from None

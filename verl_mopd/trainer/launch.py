"""The ``mopd`` block checked at launch on every hydra entry point, stock ``main_ppo`` included.

``mopd_base.yaml`` (which every verl-mopd recipe and ``mopd.yaml`` include) registers
:class:`CheckMopdBlock` under ``hydra.callbacks``. Hydra calls it in the launching process right
after composing the config and before the task function: before verl's ``main_ppo`` starts Ray. So
``python -m verl.trainer.main_ppo ... +mopd.tau_k1=0.5`` stops at once with
``mopd.tau_k1: unknown key; did you mean mopd.tau_kl?`` instead of training with the default tau,
or failing later inside a Ray actor. The trainers check the block again when they are built
(``hooks.mopd_config_from``), for a custom launcher that composes the config without hydra.

The same callback refuses, on every launch, two mistakes a recipe composes without complaint:
a ``+key`` override that nothing reads (``+rollout.n=8``; ``verl_mopd.trainer.overrides``, which
composes the config again without the additions through hydra's own config loader) and a
``mopd.gate_metric`` the configured reward cannot produce (``validate.gate_metric_problem``).

Reuses hydra's own ``Callback`` extension point; the checks are ``MOPDConfig.from_mapping``,
``overrides.unread_additions`` and ``validate.gate_metric_problem``, the ones ``verl-mopd
validate-recipe`` runs.
"""

from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

__all__ = ["CheckMopdBlock"]


def _recompose(config: DictConfig):
    """Compose the launched config again with other overrides, through hydra's own loader (the one
    ``hydra.main`` initialised): what the recipe is without some of its overrides."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    loader = GlobalHydra.instance().config_loader()
    name = config.hydra.job.config_name

    def compose(overrides: list[str]) -> DictConfig:
        return loader.load_configuration(config_name=name, overrides=list(overrides), run_mode=RunMode.RUN)

    return compose


class CheckMopdBlock(Callback):
    """Hydra callback: build ``MOPDConfig`` from the composed ``mopd`` block, refuse a ``+key`` that
    nothing reads and a gate metric the reward cannot produce; exit on any of them.

    Hydra turns an exception raised by a callback into a warning and runs the job anyway, so a bad
    config ends the process with ``SystemExit`` (its message on stderr, exit status 1), which hydra
    lets through. Warnings (a ``+key`` that looks mistyped) are printed and the job runs.
    """

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        import sys

        problems: list[str] = []
        hydra_node = config.get("hydra", None)
        overrides = list(hydra_node.overrides.task) if hydra_node is not None else []
        if overrides:
            from verl_mopd.trainer.overrides import unread_additions

            choices = set(hydra_node.runtime.choices)
            unread, warnings = unread_additions(config, overrides, _recompose(config), choices.__contains__)
            problems += unread
            for warning in warnings:
                print(f"verl-mopd: WARNING: {warning}", file=sys.stderr)
        block = config.get("mopd", None)
        if block is not None:
            from verl_mopd.config import MOPDConfig
            from verl_mopd.errors import ConfigError
            from verl_mopd.trainer.validate import gate_metric_problem

            try:
                MOPDConfig.from_mapping(block)
            except ConfigError as exc:
                problems += exc.errors
            else:
                problems += [p for p in [gate_metric_problem(config)] if p]
        if problems:
            raise SystemExit("verl-mopd: " + "\n".join(problems) if len(problems) == 1
                             else "verl-mopd: the config has problems:\n  - " + "\n  - ".join(problems))

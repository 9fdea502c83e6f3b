"""The whole recipe checked at launch on every hydra entry point, stock ``main_ppo`` included.

``mopd_base.yaml`` (which every verl-mopd recipe and ``mopd.yaml`` include) registers
:class:`CheckRecipe` under ``hydra.callbacks``. Hydra calls it in the launching process right
after composing the config and before the task function: before verl's ``main_ppo`` starts Ray. So
``python -m verl.trainer.main_ppo`` and ``python -m verl_mopd.trainer.main`` both stop at once, with
the sentences ``verl-mopd validate-recipe`` prints, on

- a mistake in the ``mopd`` block (``+mopd.tau_k1=0.5``: ``mopd.tau_k1: unknown key; did you mean
  mopd.tau_kl?``) instead of training with the default tau;
- a ``+key`` override that nothing reads (``+rollout.n=8``; :mod:`verl_mopd.checks.overrides`, which
  composes the config again without the additions through hydra's own config loader);
- every cross-section mistake of :func:`verl_mopd.checks.validate.validate_composed`: a rollout
  temperature other than 1.0, a data platform or a quota share without a teacher, a gate metric
  the reward cannot produce, verl's own ``validate_config``, ...

instead of failing later inside a Ray actor, or training wrong. Warnings are printed and the job
runs. A local path missing here is a warning, as in ``validate-recipe`` without ``--head``. The
trainers check the ``mopd`` block again when they are built (``hooks.mopd_config_from``), for a
custom launcher that composes the config without hydra.

Reuses hydra's own ``Callback`` extension point; the checks are those ``verl-mopd validate-recipe``
runs.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, open_dict, read_write

__all__ = ["CheckRecipe", "launch_findings"]


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


def _task_config(config: DictConfig) -> DictConfig:
    """The config the task function gets: ``config`` without its ``hydra`` node (as hydra's own
    ``run_job`` makes it)."""
    if "hydra" not in config:
        return config
    task = copy.deepcopy(config)
    with read_write(task), open_dict(task):
        del task["hydra"]
    return task


def launch_findings(config: DictConfig) -> tuple[list[str], list[str]]:
    """``(problems, warnings)`` of a launch: the ``+key`` overrides that nothing reads (when hydra's
    node is there), then :func:`~verl_mopd.checks.validate.validate_composed` of the task config."""
    from verl_mopd.checks.validate import validate_composed
    from verl_mopd.verl_loss import require_registered

    problems: list[str] = []
    warnings: list[str] = []
    hydra_node = config.get("hydra", None)
    overrides = list(hydra_node.overrides.task) if hydra_node is not None else []
    if overrides:
        from verl_mopd.checks.overrides import unread_additions

        choices = set(hydra_node.runtime.choices)
        problems, warnings = unread_additions(config, overrides, _recompose(config), choices.__contains__)
    require_registered("the launcher")  # before validate(), which registers mopd_k3 itself
    found, cautions = validate_composed(_task_config(config))
    return problems + found, warnings + cautions


class CheckRecipe(Callback):
    """Hydra callback: run :func:`launch_findings` on the composed config; print the warnings, and
    exit on any problem.

    Hydra turns an exception raised by a callback into a warning and runs the job anyway, so a bad
    config ends the process with ``SystemExit`` (its message on stderr, exit status 1), which hydra
    lets through.
    """

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        problems, warnings = launch_findings(config)
        for warning in warnings:
            print(f"verl-mopd: WARNING: {warning}", file=sys.stderr)
        if problems:
            raise SystemExit("verl-mopd: " + "\n".join(problems) if len(problems) == 1
                             else "verl-mopd: the config has problems:\n  - " + "\n  - ".join(problems))

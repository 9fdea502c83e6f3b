"""``verl-mopd validate-recipe``: compose a recipe file as hydra would, check it, print the findings.

The composing UI around the checks: a recipe file and its overrides become one composed config
(:func:`compose_recipe`), files that are no recipe (a partial, a config-group option) are named
with the recipe to validate instead, and the problems and warnings of
:func:`verl_mopd.checks.validate.validate_composed` (the very checks the launch callback runs) are
printed one a line. Nothing here is a check.
"""

from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

from verl_mopd.checks.overrides import compose_error, unread_additions
from verl_mopd.checks.recipe_safety import searchpath_problems
from verl_mopd.checks.validate import validate_composed

__all__ = ["addition_findings", "compose_recipe", "config_group_problem", "partial_recipe_problem",
           "validate_recipe_cli"]


def compose_recipe(path: str, overrides: list[str] | None = None, return_hydra_config: bool = False) -> DictConfig:
    """Compose a recipe YAML (with its hydra defaults and searchpath) plus overrides, as hydra would."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    path = os.path.abspath(path)
    if not os.path.isfile(path) or not path.endswith((".yaml", ".yml")):
        raise FileNotFoundError(f"recipe {path} is not a YAML file")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=os.path.dirname(path), version_base=None):
        return compose(config_name=os.path.splitext(os.path.basename(path))[0], overrides=list(overrides or []),
                       return_hydra_config=return_hydra_config)


def addition_findings(path: str, config: DictConfig, overrides: list[str]) -> tuple[list[str], list[str]]:
    """:func:`verl_mopd.checks.overrides.unread_additions` for a recipe file: the ``+key`` overrides
    that nothing reads (problems) or that look mistyped (warnings). The config groups are hydra's
    own ``hydra.runtime.choices``, as the launch callback reads them."""
    if not any(o.lstrip().startswith("+") for o in overrides):
        return [], []
    choices = set(compose_recipe(path, overrides, return_hydra_config=True).hydra.runtime.choices)
    return unread_additions(config, overrides, lambda others: compose_recipe(path, others), choices.__contains__)


def partial_recipe_problem(path: str) -> str | None:
    """Why ``path`` is a recipe partial and which recipe to validate instead, or None.

    A partial (``_name.yaml``, like ``recipes/ui_mopd/_stage2_ui_mopd.yaml``) holds keys that recipes
    compose through their ``defaults`` list; alone it lacks verl's config. The recipes named are the
    YAML files of its folder that list it."""
    name = os.path.splitext(os.path.basename(path))[0]
    if not name.startswith("_"):
        return None
    folder = os.path.dirname(path)
    users = []
    for other in sorted(os.listdir(folder or ".")):
        if other.startswith("_") or not other.endswith((".yaml", ".yml")):
            continue
        try:
            defaults = OmegaConf.to_container(OmegaConf.load(os.path.join(folder, other))).get("defaults") or []
        except Exception:  # noqa: BLE001 - not a readable recipe: it names no partial
            continue
        if any(isinstance(d, str) and (d == name or d.endswith("/" + name)) for d in defaults):
            users.append(os.path.join(folder, other))
    instead = (f"validate {' or '.join(users)}, which compose{'s' if len(users) == 1 else ''} it" if users
               else "validate a recipe that lists it in its defaults")
    return f"{path} is a recipe partial (its keys are composed into recipes), not a recipe: {instead}"


def config_group_problem(path: str) -> str | None:
    """Why ``path`` is an option of a config group and how to compose it on a recipe, or None.

    A group option (a ``# @package`` YAML in a folder beside the recipes, like
    ``recipes/ui_mopd/layout/stage2_cpu.yaml`` or ``recipes/ui_mopd/smoke/stage2_cpu.yaml``) changes
    some keys of a recipe; alone it is no run. A group the recipes' defaults list choose is selected
    with ``group=name``; any other with ``+group=name``."""
    try:
        with open(path, encoding="utf-8") as f:
            head = [line for line in f.read(4096).splitlines() if line.startswith("#")]
    except OSError:
        return None
    if not any(line.replace(" ", "").startswith("#@package") for line in head):
        return None
    folder = os.path.dirname(os.path.abspath(path))
    group, name = os.path.basename(folder), os.path.splitext(os.path.basename(path))[0]
    parent = os.path.dirname(folder)
    recipes, choosing = [], []
    for other in sorted(os.listdir(parent)):
        if other.startswith("_") or not other.endswith((".yaml", ".yml")):
            continue
        try:
            defaults = OmegaConf.to_container(OmegaConf.load(os.path.join(parent, other))).get("defaults") or []
        except Exception:  # noqa: BLE001 - not a readable recipe
            continue
        recipes.append(os.path.join(parent, other))
        if any(isinstance(d, dict) and group in d for d in defaults):
            choosing.append(os.path.join(parent, other))
    candidates = choosing or recipes or [os.path.join(parent, "<recipe>.yaml")]
    stem = name.split("_")[0]  # stage2_cpu is composed on a stage2_* recipe
    target = next((r for r in candidates if os.path.basename(r).startswith(stem)), candidates[0])
    select = f"{group}={name}" if choosing else f"+{group}={name}"
    return (f"{path} is the option {name!r} of the config group {group!r}, not a recipe: compose it on one, "
            f"e.g. verl-mopd validate-recipe {target} {select}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def validate_recipe_cli(path: str, overrides: list[str], print_config: bool = False, head: bool = False) -> int:
    """``verl-mopd validate-recipe``: 0 when valid, 1 when not; problems printed in plain words. ``head``
    (``--head``, which ``recipes/ui_mopd/run_stage{1,2}.sh`` pass): a local path missing here is an error.

    Raises ``FileNotFoundError`` (no such file) and :class:`~verl_mopd.errors.UsageError` (a recipe
    partial) before anything is composed."""
    import sys

    from verl_mopd.errors import UsageError

    if not os.path.isfile(path):
        raise FileNotFoundError(2, "no such recipe file", path)
    partial = partial_recipe_problem(path) or config_group_problem(path)
    if partial:
        raise UsageError(partial)
    refused = searchpath_problems(path, overrides)
    if refused:
        for p in refused:
            print(f"ERROR: {p}", file=sys.stderr)
        print(f"{path}: {_count(len(refused), 'problem')}", file=sys.stderr)
        return 1
    try:
        config = compose_recipe(path, overrides)
    except Exception as exc:  # noqa: BLE001 - composition errors are user errors
        error = compose_error(str(exc), overrides, lambda others: compose_recipe(path, others))
        print(f"{path}: cannot compose: {error}", file=sys.stderr)
        return 1
    problems, warnings = validate_composed(config, head=head)
    unread, suspicious = addition_findings(path, config, overrides)
    problems, warnings = unread + problems, suspicious + warnings
    if print_config:
        print(OmegaConf.to_yaml(config, resolve=True))
    from verl_mopd.teachers.placement import plan_lines

    for line in plan_lines(config):
        print(f"PLAN: {line}", file=sys.stderr)
    for w in warnings:
        print(f"WARNING: {w}", file=sys.stderr)
    for p in problems:
        print(f"ERROR: {p}", file=sys.stderr)
    print(f"{path}: {'valid' if not problems else _count(len(problems), 'problem')}", file=sys.stderr)
    return 0 if not problems else 1

"""Recipe safety: validation never runs code from the recipe.

Converting a section makes hydra instantiate its ``_target_``, so every ``_target_`` in the composed
config (overrides included) must first name one of verl's (or verl-mopd's) config dataclasses,
``verl.*`` / ``verl_mopd.*`` subclasses of verl's ``BaseConfig`` (:func:`code_target_problems`);
anything else is a problem and nothing is converted. ``pkg://`` search paths are limited to the same
packages, since hydra imports them while composing (:func:`searchpath_problems`). Used by
``verl_mopd.checks.validate``.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from omegaconf import DictConfig, OmegaConf


#: packages whose config dataclasses a recipe's ``_target_`` may name, and ``pkg://`` may import
TRUSTED_PACKAGES = ("verl", "verl_mopd")


def _trusted(dotted: str) -> bool:
    return any(dotted == p or dotted.startswith(p + ".") for p in TRUSTED_PACKAGES)


def _target_problem(where: str, target: Any) -> str | None:
    """None when ``target`` names a verl / verl-mopd config dataclass, else why not."""
    why = "validation runs no code from a recipe; allowed: verl's and verl-mopd's config dataclasses (BaseConfig)"
    if not isinstance(target, str) or not _trusted(target):
        return f"{where}._target_={target!r}: not allowed ({why})"
    from verl.base_config import BaseConfig

    obj = _resolve(target)
    if obj is None:
        return f"{where}._target_={target!r}: cannot be resolved"
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj) and issubclass(obj, BaseConfig)):
        return f"{where}._target_={target!r}: not allowed ({why})"
    return None


def _resolve(target: str) -> Any:
    parts = target.split(".")
    obj: Any = None
    for i in range(len(parts) - 1, 0, -1):  # the longest importable module prefix, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            obj = None
        break
    return obj


def config_dataclass(target: Any) -> type | None:
    """The verl / verl-mopd config dataclass that ``target`` names, or None; imports nothing outside
    those packages."""
    return None if _target_problem("", target) is not None else _resolve(target)


def code_target_problems(config: DictConfig) -> list[str]:
    """Every ``_target_`` of the composed config that is not a verl / verl-mopd config dataclass."""
    try:
        tree = OmegaConf.to_container(config, resolve=True)
    except Exception as exc:  # noqa: BLE001 - an interpolation that does not resolve
        where = getattr(exc, "full_key", None)
        return [f"{where or 'the config'} does not resolve: {str(exc).splitlines()[0]}"]
    problems: list[str] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if "_target_" in node:
                problem = _target_problem(where or "<root>", node["_target_"])
                if problem:
                    problems.append(problem)
            for key, value in node.items():
                walk(value, f"{where}.{key}" if where else str(key))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")

    walk(tree, "")
    return problems


def searchpath_problems(path: str, overrides: list[str] | None = None) -> list[str]:
    """``hydra.searchpath`` entries (recipe file or overrides) that would import a package other than
    verl's or verl-mopd's while composing. Read without composing."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    entries: list[tuple[str, Any]] = []
    try:
        primary = OmegaConf.load(path)
        entries.append((path, OmegaConf.select(primary, "hydra.searchpath", default=None)))
    except Exception as exc:  # noqa: BLE001 - compose reports unreadable YAML itself
        return [f"{path}: not readable YAML ({str(exc).splitlines()[0]})"]
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides or []))
    except Exception as exc:  # noqa: BLE001 - a malformed override
        return [f"overrides: {str(exc).splitlines()[0]}"]
    for o in parsed:
        if o.key_or_group == "hydra.searchpath":
            entries.append(("override hydra.searchpath", o.value()))
    problems = []
    for where, value in entries:
        values = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        for entry in values if isinstance(values, list) else ([] if values is None else [values]):
            entry = str(entry)
            if entry.startswith("pkg://") and not _trusted(entry[len("pkg://") :].strip("/").replace("/", ".")):
                problems.append(
                    f"{where}: hydra.searchpath entry {entry!r} would import that package; validation runs no code "
                    f"from a recipe (pkg:// is allowed for {list(TRUSTED_PACKAGES)}; use file:// for YAML folders)"
                )
    return problems

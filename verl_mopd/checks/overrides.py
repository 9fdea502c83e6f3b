"""Hydra overrides that nothing reads, on every launch path.

Hydra answers ``rollout.n=8`` (a key the recipe lacks) with "Could not override 'rollout.n'. To
append to your config use +rollout.n=8". Following that advice composes a config with a new
top-level ``rollout`` block that verl never reads, while ``actor_rollout_ref.rollout.n`` keeps its
value: the run starts, with the wrong group size. :func:`unread_additions` finds such ``+key`` (and
``++key``) overrides. The config is composed again without them, and each added key is placed at the
first part of its path that the recipe lacks:

- at the root: verl reads a fixed set of top-level sections, so a new one is read only by an
  interpolation of the recipe (``${name...}``); otherwise it is an error naming the nearest real key
  (``+rollout.n=8`` -> ``actor_rollout_ref.rollout.n``);
- in a section that verl builds into a config dataclass (it has a ``_target_``): read iff the
  dataclass has that field, else an error naming the nearest field;
- in a plain section (``data``, ``trainer``, ``reward_kwargs``, ...): verl reads those with
  ``.get(key, default)``, so a new key may be read; a warning when a sibling is a near spelling.

A hydra key that is no key (``rollout.n=8`` without ``+``) gets the nearest real key too
(:func:`compose_error`), never hydra's ``+`` advice alone. ``verl-mopd validate-recipe``
(``verl_mopd.checks.validate``) and the hydra callback of ``mopd_base.yaml``
(``verl_mopd.checks.launch``, in every hydra launch) call them.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Iterator
from typing import Any

from omegaconf import DictConfig, OmegaConf

__all__ = ["compose_error", "nearest_key", "nearest_keys", "unread_additions"]


def nearest_key(config: DictConfig, dotted: str) -> str | None:
    """The existing key nearest to a mistyped ``dotted`` key: the first missing part replaced by its
    closest sibling (``mopd.tau_k`` -> ``mopd.tau_kl``) when the rest of the path then exists; a path
    under the wrong section is looked up again from the root (``algorithm.mopd.tau`` -> ``mopd.tau_kl``)."""
    parts = dotted.split(".")
    for start in range(len(parts)):
        node: Any = config
        for i in range(start, len(parts)):
            if not isinstance(node, DictConfig):
                break
            if parts[i] in node:
                node = node._get_node(parts[i])
                continue
            for close in difflib.get_close_matches(parts[i], [str(k) for k in node.keys()], n=3, cutoff=0.6):
                candidate = parts[start:i] + [close] + parts[i + 1 :]
                if _exists(config, candidate):
                    return ".".join(candidate)
            break
    return None


def _exists(config: DictConfig, parts: list[str]) -> bool:
    node: Any = config
    for part in parts:
        if not isinstance(node, DictConfig) or part not in node:
            return False
        node = node._get_node(part)
    return True


def _paths(node: Any, prefix: str = "") -> Iterator[str]:
    if not isinstance(node, DictConfig):
        return
    for key in node.keys():
        if not prefix and key == "hydra":
            continue
        path = f"{prefix}{key}"
        yield path
        yield from _paths(node._get_node(key), path + ".")


def nearest_keys(config: DictConfig, dotted: str) -> list[str]:
    """The real keys a user most likely meant by ``dotted``: a mistyped part (:func:`nearest_key`),
    else the keys that end with it (``rollout.n`` -> ``actor_rollout_ref.rollout.n``; at most 3,
    shallowest first), else the nearest full path."""
    near = nearest_key(config, dotted)
    if near is not None:
        return [near]
    paths = list(_paths(config))
    tail = sorted((p for p in paths if p.endswith("." + dotted)), key=lambda p: (p.count("."), p))
    if tail:
        return tail[:3]
    return difflib.get_close_matches(dotted, paths, n=1, cutoff=0.8)


def _did_you_mean(keys: list[str], value: str | None) -> str:
    if not keys:
        return ""
    others = f" (or {' or '.join(keys[1:])})" if len(keys) > 1 else ""
    fix = f"; set {keys[0]}={value}, without '+'" if value is not None else ""
    return f"; did you mean {keys[0]}{others}?{fix}"


def _key_additions(overrides: list[str], is_group: Callable[[str], bool]) -> list[tuple[str, str, str | None]]:
    """``(override, key, value)`` of every ``+key=value`` / ``++key=value`` that adds a config key
    (not a config group option such as ``+layout=stage2_cpu``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    found = []
    for text, override in zip(overrides, OverridesParser.create().parse_overrides(overrides), strict=True):
        if not (override.is_add() or override.is_force_add()) or override.is_delete():
            continue
        key = override.key_or_group
        if "/" in key or override.package is not None or is_group(key):
            continue
        value = text.split("=", 1)[1] if "=" in text else None
        found.append((text, key, value))
    return found


def _read_by_interpolation(config: DictConfig, name: str) -> bool:
    text = OmegaConf.to_yaml(config, resolve=False)
    return re.search(r"\$\{(?:[\w.]+:)?\s*" + re.escape(name) + r"(?![\w])", text) is not None


def unread_additions(
    config: DictConfig,
    overrides: list[str],
    compose: Callable[[list[str]], DictConfig],
    is_group: Callable[[str], bool],
) -> tuple[list[str], list[str]]:
    """Problems and warnings of the ``+key`` overrides that nothing reads (see the module docstring).

    Args:
        config: the composed config (the hydra node may be there or not).
        overrides: the command-line overrides it was composed with.
        compose: composes the same recipe with other overrides (to see the recipe without the additions).
        is_group: whether a name is a config group of the recipe's search path.
    """
    from verl_mopd.checks.recipe_safety import config_dataclass

    added = _key_additions(overrides, is_group)
    if not added:
        return [], []
    removed = {text for text, _, _ in added}
    try:
        base = compose([o for o in overrides if o not in removed])
    except Exception:  # noqa: BLE001 - the other overrides depend on an addition: nothing to compare with
        return [], []
    problems: list[str] = []
    warnings: list[str] = []
    for text, key, value in added:
        parts = key.split(".")
        node: Any = base
        depth = 0
        while depth < len(parts) and isinstance(node, DictConfig) and parts[depth] in node:
            node = node._get_node(parts[depth])
            depth += 1
        if depth == len(parts) or not isinstance(node, DictConfig):
            continue  # ++ of an existing key, or an addition below a value: hydra's own business
        new, where = parts[depth], ".".join(parts[:depth])
        if depth == 0:
            if _read_by_interpolation(config, new):
                continue
            sections = ", ".join(str(k) for k in base.keys() if k != "hydra")
            near = nearest_keys(base, key)
            allowed = "" if near else f"; the top-level sections are: {sections}"
            problems.append(
                f"{text}: nothing reads {key}: the recipe has no {new!r} section and verl reads only its own "
                f"top-level sections{_did_you_mean(near, value)}{allowed}"
            )
            continue
        target = node.get("_target_") if "_target_" in node else None
        cls = config_dataclass(target) if target is not None else None
        if cls is not None and dataclasses.is_dataclass(cls):
            fields = sorted(f.name for f in dataclasses.fields(cls) if not f.name.startswith("_"))
            if new in fields:
                continue
            close = difflib.get_close_matches(new, fields, n=1, cutoff=0.6)
            near = [f"{where}.{close[0]}"] if close else []
            allowed = "" if near else f"; its fields are: {', '.join(fields)}"
            problems.append(
                f"{text}: nothing reads {key}: {where} is verl's {cls.__name__} ({target}), which has no field "
                f"{new!r}{_did_you_mean(near, value)}{allowed}"
            )
            continue
        close = difflib.get_close_matches(new, [str(k) for k in node.keys()], n=1, cutoff=0.8)
        if close:
            warnings.append(
                f"{text}: {where} has no key {new!r} in the recipe (verl reads it only if its code asks for that "
                f"name); did you mean {where}.{close[0]}?"
            )
    return problems, warnings


def compose_error(message: str, overrides: list[str], compose: Callable[[list[str]], DictConfig]) -> str:
    """hydra's composition error; for a key that is not in the recipe, the nearest real key instead of
    hydra's ``+key`` advice (which would add a key nothing reads)."""
    match = re.match(r"Could not override '([^']+)'", message)
    if match is None:
        return message
    key = match.group(1)
    others = [o for o in overrides if o.split("=", 1)[0].lstrip("~+") != key]
    given = next((o for o in overrides if o.split("=", 1)[0] == key), key)
    try:
        config = compose(others)
    except Exception:  # noqa: BLE001 - another override fails too: hydra's own message
        return message
    near = nearest_keys(config, key)
    if near:
        return f"{key} is not a key of this recipe ({given}); did you mean {' or '.join(near)}?"
    first = message.split("\n")[0].strip()
    return (f"{first} {key} is not a key of this recipe, and hydra's '+{given}' would add a key that verl may "
            "never read: check the name against the composed config (verl-mopd validate-recipe RECIPE --print)")

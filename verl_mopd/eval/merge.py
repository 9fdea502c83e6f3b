"""Baselines for the comparison table: weight-average and TIES merges of platform checkpoints.

UI-MOPD compares the distilled student with merging the platform experts into one model. Both
merges run tensor by tensor over safetensors checkpoints (Hugging Face layout, one file or an
index of shards), so an 8B merge never holds more than one tensor of each model in memory at
once, plus the output shard being written.

- ``average``: ``theta = sum_i w_i * theta_i`` with ``sum_i w_i = 1`` (uniform by default).
- ``ties`` (Yadav et al., 2023, "TIES-Merging"): task vectors ``tau_i = theta_i - theta_base``;
  keep the top ``density`` fraction of each by magnitude (per tensor), elect the sign of
  ``sum_i tau_i`` per entry, average the weighted entries that agree with it; ``theta =
  theta_base + lambda * merged``. The trim / elect / disjoint-merge steps are peft's
  ``peft.utils.merge_utils.ties`` (maintained, already a dependency of our stack); ``lambda`` is
  ``scale``. mergekit implements the same per-tensor TIES, but pins its own torch and
  transformers ranges and brings a YAML layer we do not need, so it is not used.

Arithmetic is float32 (float64 with ``compute_dtype="float64"``), the result cast back to each
tensor's stored dtype. Tensors that are not floating point (integer buffers) must be equal in
every model and are copied. Non-weight files (config, tokenizer, chat template, processor) are
copied from the first model.

The output is all or nothing: names and shapes of every model are checked before anything is
written, the checkpoint is built in a temporary folder beside ``out_dir`` and renamed into place
at the end, and a NaN/inf weight in any input is an error naming the tensor and the model.
``out_dir`` may not be (or hold, or lie inside) one of the inputs, and an existing ``out_dir``
is replaced only when it is an earlier merge output (it has ``merge_config.json``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Iterator

import torch

from verl_mopd.errors import ConfigError, UsageError
from verl_mopd.files import refuse_overwrite

METHODS = ("average", "ties")
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5")


@dataclass(frozen=True)
class MergeConfig:
    """What to merge and how.

    Attributes:
        method: ``"average"`` or ``"ties"``.
        models: checkpoint folders to merge (two platform experts, or more).
        base: the common starting checkpoint (required by ``ties``, unused by ``average``).
        weights: one per model; ``average`` needs them to sum to 1 (default uniform); ``ties``
            scales each task vector (default 1.0 each).
        density: ``ties``: fraction of each task vector kept (0 < density <= 1).
        scale: ``ties``: lambda, the factor on the merged task vector.
        majority_sign_method: ``ties``: ``"total"`` (sign of the sum, the paper's) or
            ``"frequency"`` (sign of the count).
        compute_dtype: ``"float32"`` or ``"float64"``.
    """

    method: str
    models: tuple[str, ...]
    base: str | None = None
    weights: tuple[float, ...] | None = None
    density: float = 0.5
    scale: float = 1.0
    majority_sign_method: str = "total"
    compute_dtype: str = "float32"
    resolved_weights: tuple[float, ...] = field(init=False, default=())

    def __post_init__(self):
        errors = []
        if self.method not in METHODS:
            errors.append(f"method={self.method!r}: allowed {list(METHODS)}")
        if len(self.models) < 2:
            errors.append(f"models={list(self.models)}: give at least two checkpoints")
        n = len(self.models)
        weights = self.weights
        if weights is not None and len(weights) != n:
            errors.append(f"weights={list(weights)}: need one per model ({n})")
        if self.method == "average":
            weights = tuple(weights) if weights is not None else tuple(1.0 / n for _ in range(n))
            if abs(sum(weights) - 1.0) > 1e-6:
                errors.append(f"weights={list(weights)}: a weight average needs weights summing to 1")
        if self.method == "ties":
            weights = tuple(weights) if weights is not None else tuple(1.0 for _ in range(n))
            if self.base is None:
                errors.append("base: TIES needs the common base checkpoint (task vectors are model - base)")
            if not 0 < self.density <= 1:
                errors.append(f"density={self.density!r}: must be in (0, 1]")
            if self.majority_sign_method not in ("total", "frequency"):
                errors.append(f"majority_sign_method={self.majority_sign_method!r}: allowed ['total', 'frequency']")
        if self.compute_dtype not in ("float32", "float64"):
            errors.append(f"compute_dtype={self.compute_dtype!r}: allowed ['float32', 'float64']")
        if errors:
            raise ConfigError(errors, "merge config")
        object.__setattr__(self, "resolved_weights", tuple(float(w) for w in weights))


def weight_files(path: str) -> dict[str, str]:
    """``{tensor name: safetensors file}`` of a checkpoint folder."""
    index = os.path.join(path, INDEX)
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            wmap = json.load(f)["weight_map"]
        return {k: os.path.join(path, v) for k, v in wmap.items()}
    single = os.path.join(path, SINGLE)
    if os.path.exists(single):
        from safetensors import safe_open

        with safe_open(single, "pt") as f:
            return {k: single for k in f.keys()}
    raise FileNotFoundError(f"{path}: no {SINGLE} or {INDEX} (save the model with safe_serialization)")


class _Reader:
    """Open safetensors handles of one checkpoint, tensor by tensor."""

    def __init__(self, path: str):
        from safetensors import safe_open

        self.path = path
        self.files = weight_files(path)
        self._handles = {f: safe_open(f, "pt") for f in set(self.files.values())}

    def get(self, name: str) -> torch.Tensor:
        return self._handles[self.files[name]].get_tensor(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handles[self.files[name]].get_slice(name).get_shape())


def merge_tensor(cfg: MergeConfig, tensors: list[torch.Tensor], base: torch.Tensor | None) -> torch.Tensor:
    """Merge one tensor across models (same shape); returns it in ``tensors[0].dtype``."""
    dtype = getattr(torch, cfg.compute_dtype)
    out_dtype = tensors[0].dtype
    if cfg.method == "average":
        acc = torch.zeros(tensors[0].shape, dtype=dtype)
        for w, t in zip(cfg.resolved_weights, tensors, strict=True):
            acc += w * t.to(dtype)
        return acc.to(out_dtype)
    from peft.utils.merge_utils import ties

    b = base.to(dtype)
    deltas = [t.to(dtype) - b for t in tensors]
    with warnings.catch_warnings():  # peft warns that density 1 prunes nothing; that is the point
        warnings.simplefilter("ignore", UserWarning)
        merged = ties(deltas, torch.tensor(cfg.resolved_weights, dtype=dtype), cfg.density, cfg.majority_sign_method)
    return (b + cfg.scale * merged).to(out_dtype)


def _shards(path: str, names: list[str]) -> dict[str, list[str]]:
    """Output layout: the first model's shard file names (one file when it has one)."""
    files = weight_files(path)
    out: dict[str, list[str]] = {}
    for n in names:
        out.setdefault(os.path.basename(files[n]), []).append(n)
    return out


def merge_checkpoints(cfg: MergeConfig, out_dir: str) -> dict[str, int]:
    """Write the merged checkpoint to ``out_dir`` (whole or not at all); returns counts (merged,
    copied tensors, files). Raises ValueError (``UsageError`` for the output folder) before
    writing anything when the inputs do not fit together."""
    inputs = [*cfg.models, *([cfg.base] if cfg.base else [])]
    refuse_overwrite(out_dir, inputs, "--out", replaces_folder=True)
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not os.path.exists(os.path.join(out_dir, "merge_config.json")):
        raise UsageError(f"--out={out_dir}: exists and is not an earlier merge output; remove it or choose another folder")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"--out={out_dir}: is a file; give a folder")
    readers = [_Reader(p) for p in cfg.models]
    base = _Reader(cfg.base) if cfg.method == "ties" else None
    others = [*readers[1:], *([base] if base else [])]
    names = sorted(readers[0].files)
    for r in others:
        if set(r.files) != set(names):
            a, b = set(names) - set(r.files), set(r.files) - set(names)
            raise ValueError(
                f"{r.path}: tensor names differ from {cfg.models[0]}: missing {sorted(a)[:5]}, extra {sorted(b)[:5]}"
            )
    for name in names:  # from the headers, before any tensor is read or written
        shape = readers[0].shape(name)
        for r in others:
            if r.shape(name) != shape:
                raise ValueError(f"tensor {name!r}: shape {r.shape(name)} in {r.path} vs {shape} in {readers[0].path}")
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out_dir))}.", suffix=".tmp", dir=parent)
    try:
        counts = _write_merge(cfg, readers, base, names, tmp)
        _replace_folder(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return counts


def _replace_folder(new: str, target: str) -> None:
    """Move ``new`` to ``target``; an existing ``target`` (an earlier merge) is removed only after."""
    if not os.path.exists(target):
        os.replace(new, target)
        return
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(target))}.", suffix=".old", dir=os.path.dirname(os.path.abspath(target)))
    os.replace(target, os.path.join(old, "previous"))
    os.replace(new, target)
    shutil.rmtree(old, ignore_errors=True)


def _check_finite(name: str, merged: torch.Tensor, tensors: list[torch.Tensor], paths: list[str]) -> None:
    if bool(torch.isfinite(merged).all()):
        return
    for t, path in zip(tensors, paths, strict=True):
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"tensor {name!r} in {path} has NaN/inf weights; nothing was written")
    raise ValueError(f"tensor {name!r}: the merge overflows {merged.dtype} (NaN/inf); try --compute-dtype float64")


def _write_merge(cfg: MergeConfig, readers: list[_Reader], base: _Reader | None, names: list[str], out_dir: str) -> dict[str, int]:
    from safetensors.torch import save_file

    counts = {"merged": 0, "copied": 0, "files": 0}
    layout = _shards(cfg.models[0], names)
    paths = [r.path for r in readers] + ([base.path] if base else [])
    weight_map: dict[str, str] = {}
    for fname, shard_names in layout.items():
        shard: dict[str, torch.Tensor] = {}
        for name in shard_names:
            ts = [r.get(name) for r in readers]
            bt = base.get(name) if base else None
            if ts[0].is_floating_point():
                shard[name] = merge_tensor(cfg, ts, bt).contiguous()
                _check_finite(name, shard[name], [*ts, *([bt] if base else [])], paths)
                counts["merged"] += 1
            else:
                if any(not torch.equal(ts[0], t) for t in ts[1:]):
                    raise ValueError(f"tensor {name!r} ({ts[0].dtype}) is not floating point and differs between models")
                shard[name] = ts[0].contiguous()
                counts["copied"] += 1
            weight_map[name] = fname
        save_file(shard, os.path.join(out_dir, fname), metadata={"format": "pt"})
    if len(layout) > 1 or os.path.exists(os.path.join(cfg.models[0], INDEX)):
        with open(os.path.join(out_dir, INDEX), "w", encoding="utf-8") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)
    for fname in _other_files(cfg.models[0]):
        if fname == "merge_config.json":  # a merged model merged again: ours is written below
            continue
        shutil.copy2(os.path.join(cfg.models[0], fname), os.path.join(out_dir, fname))
        counts["files"] += 1
    with open(os.path.join(out_dir, "merge_config.json"), "w", encoding="utf-8") as f:
        json.dump(
            {
                "method": cfg.method,
                "models": list(cfg.models),
                "base": cfg.base,
                "weights": list(cfg.resolved_weights),
                "density": cfg.density,
                "scale": cfg.scale,
                "majority_sign_method": cfg.majority_sign_method,
                "library": "peft.utils.merge_utils.ties" if cfg.method == "ties" else "torch",
            },
            f,
            indent=2,
        )
    return counts


def _other_files(path: str) -> Iterator[str]:
    for fname in sorted(os.listdir(path)):
        full = os.path.join(path, fname)
        if os.path.isfile(full) and not fname.endswith(_WEIGHT_SUFFIXES) and fname != INDEX:
            yield fname

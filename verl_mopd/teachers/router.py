"""Route a step batch by platform: split row indices per key, merge per-key results back in order.

Pure functions (numpy / torch, no Ray). The router knows nothing about teachers; it only
guarantees that ``merge(parts, split(keys), n)`` puts every row back where it came from.

Row selection reuses verl: ``DataProto.select_idxs`` (tensor batch + ``non_tensor_batch``, so
``multi_modal_inputs``, ``raw_prompt``, images stored as object arrays travel with their rows)
and ``verl.utils.tensordict_utils.index_select_tensor_dict`` (padded tensors, nested/jagged
no-padding tensors, ``NonTensorStack`` fields).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch

__all__ = [
    "UnknownRouteError",
    "split",
    "merge",
    "routing_keys",
    "take_rows",
    "check_known",
]


class UnknownRouteError(KeyError):
    """A routing key that names no configured teacher."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


def _as_key_array(keys: Sequence[str] | np.ndarray) -> np.ndarray:
    arr = np.asarray(keys, dtype=object)
    if arr.ndim != 1:
        raise ValueError(f"routing keys must be 1-D (one key per row), got shape {arr.shape}")
    return arr


def check_known(keys: Iterable[str], known: Iterable[str], field: str = "platform") -> None:
    """Raise ``UnknownRouteError`` naming every key not in ``known`` and the configured ones."""
    known = set(known)
    unknown = sorted({str(k) for k in keys} - known)
    if unknown:
        raise UnknownRouteError(
            f"{field} value(s) {unknown} have no teacher; configured teachers: {sorted(known)}. "
            f"Add mopd.teachers.<{field}> for each, or fix the data's `{field}` column."
        )


def split(keys: Sequence[str] | np.ndarray, known: Iterable[str] | None = None,
          field: str = "platform") -> dict[str, np.ndarray]:
    """Row indices of each routing key.

    Args:
        keys: ``(n,)`` routing key of every row (e.g. the ``platform`` column).
        known: if given, every key must be in it, else ``UnknownRouteError`` (names the key and
            the configured teachers). A known key with no rows in this batch is absent from the
            result (skipped, not an empty part).
        field: the routing column's name (``mopd.routing_key``), which that error names.

    Returns:
        ``{key: int64 array of row indices, ascending}``; the arrays partition ``range(n)``.
        Keys appear in order of first occurrence.
    """
    arr = _as_key_array(keys)
    if known is not None:
        check_known(arr.tolist(), known, field)
    if arr.size == 0:
        return {}
    uniq, first, inverse = np.unique(arr.astype(str), return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    # stable argsort of the group id gives, per group, its rows in ascending order
    rows = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse, minlength=len(uniq)))
    starts = np.concatenate([[0], bounds[:-1]])
    return {str(uniq[g]): rows[starts[g] : bounds[g]].astype(np.int64) for g in order}


def merge(
    parts: Mapping[str, torch.Tensor],
    index: Mapping[str, np.ndarray],
    n: int,
    fill: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Scatter per-key results back to the original row order.

    Args:
        parts: ``{key: (len(index[key]), *S)}`` tensors, all with the same trailing shape ``S``
            and dtype. Nested (jagged) parts are merged into a jagged tensor (``fill`` unsupported).
        index: ``{key: row indices}`` as returned by ``split`` (or any disjoint subset of rows).
        n: number of rows of the result.
        fill: value for rows that no part covers. ``None`` (default) makes an uncovered row an
            error; a tensor of shape ``(n, *S)`` supplies a per-row fill (e.g. the student's own
            log-probs for rows that were not sent to a teacher).

    Returns:
        ``(n, *S)`` tensor; row ``index[k][j]`` is ``parts[k][j]``.
    """
    if set(parts) != set(index):
        raise KeyError(f"merge: parts have keys {sorted(parts)} but index has {sorted(index)}")
    owner = np.full(n, -1, dtype=np.int64)
    for slot, key in enumerate(index):
        rows = np.asarray(index[key], dtype=np.int64)
        if len(rows) != parts[key].shape[0]:
            raise ValueError(f"merge: part {key!r} has {parts[key].shape[0]} rows, index has {len(rows)}")
        if rows.size and (rows.min() < 0 or rows.max() >= n):
            raise IndexError(f"merge: index {key!r} has rows outside [0, {n})")
        if (owner[rows] != -1).any() or len(np.unique(rows)) != len(rows):
            raise ValueError(f"merge: row(s) of {key!r} are claimed twice")
        owner[rows] = slot
    uncovered = np.flatnonzero(owner == -1)
    if uncovered.size and fill is None:
        raise ValueError(f"merge: {uncovered.size} of {n} rows are covered by no part (first: {uncovered[:5]})")

    nonempty = [k for k in index if len(index[k])]
    if any(parts[k].is_nested for k in nonempty):
        if uncovered.size:
            raise ValueError("merge: `fill` is not supported for nested parts")
        rows_out: list[torch.Tensor | None] = [None] * n
        for key in nonempty:
            for r, value in zip(index[key], parts[key].unbind(0), strict=True):
                rows_out[int(r)] = value
        from verl.utils.tensordict_utils import nested_tensor_from_tensor_list

        ref = parts[nonempty[0]]
        return nested_tensor_from_tensor_list(rows_out, ragged_idx=getattr(ref, "_ragged_idx", ref.dim() - 1))

    if isinstance(fill, torch.Tensor):
        out = fill.clone()
        if out.shape[0] != n:
            raise ValueError(f"merge: fill has {out.shape[0]} rows, expected {n}")
    else:
        if not nonempty:
            raise ValueError("merge: no rows to merge and no fill tensor to take the shape from")
        ref = parts[nonempty[0]]
        out = ref.new_full((n, *ref.shape[1:]), float(fill) if fill is not None else 0.0)
    for key in nonempty:
        part = parts[key]
        if part.shape[1:] != out.shape[1:]:
            raise ValueError(f"merge: part {key!r} has row shape {tuple(part.shape[1:])}, expected {tuple(out.shape[1:])}")
        out[torch.as_tensor(index[key], device=out.device)] = part.to(out.dtype)
    return out


def routing_keys(batch, field: str = "platform") -> np.ndarray:
    """The ``(n,)`` object array of routing keys of a DataProto or TensorDict batch.

    Reads the top-level column ``field`` (the same column verl's ``distillation.teacher_key``
    reads), from ``DataProto.non_tensor_batch`` or a TensorDict non-tensor field.
    """
    from verl.protocol import DataProto

    if isinstance(batch, DataProto):
        if field not in batch.non_tensor_batch:
            raise KeyError(
                f"routing field {field!r} not in the batch's non_tensor_batch (has {sorted(batch.non_tensor_batch)})"
            )
        return _as_key_array(list(batch.non_tensor_batch[field]))
    if field not in batch.keys():
        raise KeyError(f"routing field {field!r} not in the batch (has {sorted(batch.keys())})")
    val = batch.get(field)
    values = val.tolist() if hasattr(val, "tolist") else list(val)
    return _as_key_array(values)


def take_rows(batch, rows: np.ndarray):
    """Rows ``rows`` of a DataProto or TensorDict, every field (padded, jagged, non-tensor) kept aligned."""
    rows = np.asarray(rows, dtype=np.int64)
    from verl.protocol import DataProto

    if isinstance(batch, DataProto):
        return batch.select_idxs(rows)
    from verl.utils.tensordict_utils import index_select_tensor_dict

    return index_select_tensor_dict(batch, torch.from_numpy(rows))


def get_field(batch, key):
    """A field of a DataProto (tensor or non-tensor) or TensorDict batch, or None if absent."""
    from verl.protocol import DataProto

    if isinstance(batch, DataProto):
        if batch.batch is not None and key in batch.batch.keys():
            return batch.batch[key]
        return batch.non_tensor_batch.get(key)
    return batch.get(key) if key in batch.keys() else None

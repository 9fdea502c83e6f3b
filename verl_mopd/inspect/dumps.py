"""Read a run's per-sample dumps into :class:`Sample` records: ours or verl's.

Two formats, both written by a training run:

- **step dumps** (``step_<N>.pt``): what :func:`verl_mopd.trainer.hooks.dump_step` writes when
  ``VERL_MOPD_STEP_DUMP`` names a folder (the ``mopd_*`` trainers, ``verl-mopd smoke``): every
  sample of a step as verl's actor reads it, with the token ids, the student's ``old_log_probs``,
  the teacher's log-probs, the response mask, the reward gate and the task score. K3 needs these.
- **verl's rollout dumps** (``<step>.jsonl``): what verl 0.9.1's trainer writes when
  ``trainer.rollout_data_dir`` is set (``PPOTrainer._write_generations``): one line per sample with
  ``input`` and ``output`` (decoded text), ``gts`` (the ground truth), ``score`` (the summed
  ``rm_scores``), ``step`` and ``uid``. No log-probs: only the text and the score over steps.

A folder holding neither is searched below for the one folder that holds step dumps (or, failing
that, rollout dumps), so ``verl-mopd inspect`` takes a smoke's output folder as well as its
``stage2/dumps``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from verl_mopd.errors import UsageError

__all__ = ["STEP_ROW_FIELDS", "Dumps", "Sample", "find_dumps", "read_dumps", "read_rollout_dumps", "read_step_dumps"]

#: the fields of a step dump's row that ``inspect`` reads (``dump_step`` writes these and more)
STEP_ROW_FIELDS = ("padding", "platform", "uid", "input_ids", "response_mask", "student", "teacher", "gate",
                   "kl_start", "score")
_STEP_FILE = re.compile(r"^step_(\d+)\.pt$")
_ROLLOUT_FILE = re.compile(r"^(\d+)\.jsonl$")


@dataclass
class Sample:
    """One rollout of one step. Response-aligned arrays have the response's length ``r``; from a
    rollout dump (text only) ``token_ids`` and the log-probs are None and ``text`` holds the output."""

    step: int
    platform: str
    uid: str
    score: float | None
    gate: float | None = None          # mopd_kl_mask: 1 = KL on, 0 = gated off; None: not dumped
    token_ids: list[int] | None = None  # the response's token ids
    response_mask: np.ndarray | None = None
    student: np.ndarray | None = None   # old_log_probs of the sampled tokens (float64)
    teacher: np.ndarray | None = None   # the teacher's log-probs of the same tokens (float64)
    kl_start: int | None = None         # first response position the KL counts (kl_skip_thought)
    text: str | None = None             # the decoded response (rollout dumps)
    prompt: str | None = None           # the decoded prompt (rollout dumps)
    key: str = ""                       # the sample's own key (verl's TransferQueue key; uid is its group's)


@dataclass
class Dumps:
    kind: str              # "step" (ours) or "rollout" (verl's trainer.rollout_data_dir)
    folder: Path
    files: list[Path]
    samples: list[Sample]
    padding_rows: int = 0  # rows verl added to fill a batch (step dumps); not samples of the run


def _numbered(folder: Path, pattern: re.Pattern) -> list[Path]:
    found = [(int(m.group(1)), p) for p in folder.iterdir() if p.is_file() and (m := pattern.match(p.name))]
    return [p for _, p in sorted(found)]


def find_dumps(folder: str | os.PathLike) -> tuple[str, Path, list[Path]]:
    """``(kind, folder, files)`` of the dumps in ``folder``, or in the one folder below it holding them.

    Raises UsageError naming ``folder`` when there is none, or when several folders below it hold
    dumps (they are listed: give one)."""
    root = Path(folder)
    if not root.exists():
        raise UsageError(f"DIR={folder}: no such folder")
    if not root.is_dir():
        raise UsageError(f"DIR={folder}: is a file; give the folder that holds step_<N>.pt (VERL_MOPD_STEP_DUMP) "
                         "or <step>.jsonl (verl's trainer.rollout_data_dir)")
    for kind, pattern in (("step", _STEP_FILE), ("rollout", _ROLLOUT_FILE)):
        if files := _numbered(root, pattern):
            return kind, root, files
    for kind, glob, pattern in (("step", "step_*.pt", _STEP_FILE), ("rollout", "*.jsonl", _ROLLOUT_FILE)):
        folders = sorted({p.parent for p in root.rglob(glob) if pattern.match(p.name)})
        if len(folders) == 1:
            return kind, folders[0], _numbered(folders[0], pattern)
        if len(folders) > 1:
            listed = ", ".join(str(f) for f in folders[:6]) + (", ..." if len(folders) > 6 else "")
            raise UsageError(f"DIR={folder}: {len(folders)} folders below it hold {glob} dumps ({listed}); give one")
    raise UsageError(f"DIR={folder}: no dumps in it or below it: expected step_<N>.pt (written with "
                     "VERL_MOPD_STEP_DUMP=DIR by the mopd_* trainers) or <step>.jsonl "
                     "(verl's trainer.rollout_data_dir)")


def _array(value, name: str, where: str) -> np.ndarray:
    import torch

    if not isinstance(value, torch.Tensor):
        raise UsageError(f"{where}: field {name!r} is {type(value).__name__}, expected a tensor")
    return value.detach().to(torch.float64).reshape(-1).numpy()


def read_step_dumps(files: list[Path]) -> tuple[list[Sample], int]:
    """The samples of ``step_<N>.pt`` files (``dump_step``'s format), padding rows left out.

    Loaded with ``torch.load(weights_only=True)``: tensors, numbers, strings, lists and dicts only,
    so a dump cannot run code. Returns ``(samples, padding rows skipped)``."""
    import torch

    samples, padding = [], 0
    for path in files:
        try:
            dump = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - a file that is not a step dump is a user error
            raise UsageError(f"{path}: not a readable step dump ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''})") from exc
        if not isinstance(dump, dict) or not isinstance(dump.get("rows"), list):
            raise UsageError(f"{path}: not a step dump: expected a dict with 'rows' "
                             "(verl_mopd.trainer.hooks.dump_step)")
        step = dump.get("step")
        if step is None:
            step = int(_STEP_FILE.match(path.name).group(1))
        for i, row in enumerate(dump["rows"]):
            where = f"{path}: row {i}"
            if not isinstance(row, dict):
                raise UsageError(f"{where}: expected a dict, got {type(row).__name__}")
            missing = [f for f in STEP_ROW_FIELDS if f not in row]
            if missing:
                raise UsageError(f"{where}: missing field(s) {missing}; a step dump row has {list(STEP_ROW_FIELDS)}")
            if row["padding"]:
                padding += 1
                continue
            ids = row["input_ids"]
            student = _array(row["student"], "student", where) if row["student"] is not None else None
            if student is None:
                raise UsageError(f"{where}: field 'student' (old_log_probs) is None: the step dump has no log-probs")
            r = len(student)
            mask = _array(row["response_mask"], "response_mask", where) if row["response_mask"] is not None \
                else np.ones(r)
            teacher = _array(row["teacher"], "teacher", where) if row["teacher"] is not None else None
            if len(ids) < r or len(mask) != r or (teacher is not None and len(teacher) != r):
                raise UsageError(f"{where}: lengths disagree: input_ids {len(ids)}, student {r}, response_mask "
                                 f"{len(mask)}, teacher {None if teacher is None else len(teacher)} (the response is "
                                 "the last len(student) of input_ids)")
            samples.append(Sample(
                step=int(step), platform=str(row["platform"]), uid=str(row["uid"]),
                score=None if row["score"] is None else float(row["score"]),
                gate=None if row["gate"] is None else float(row["gate"]),
                key=str(row.get("key", f"{path.name}:{i}")),
                token_ids=[int(t) for t in ids[len(ids) - r:].tolist()],
                response_mask=mask, student=student, teacher=teacher,
                kl_start=None if row["kl_start"] is None else int(row["kl_start"])))
    return samples, padding


def _platform_of(record: dict, routing_key: str) -> str | None:
    if record.get(routing_key) is not None:
        return str(record[routing_key])
    gts = record.get("gts")
    if isinstance(gts, str):
        try:
            gts = json.loads(gts)
        except json.JSONDecodeError:
            return None
    if isinstance(gts, dict) and gts.get(routing_key) is not None:
        return str(gts[routing_key])
    return None


def read_rollout_dumps(files: list[Path], routing_key: str = "platform") -> list[Sample]:
    """The samples of verl's ``<step>.jsonl`` rollout dumps; each one's routing value (its platform) is
    the record's ``routing_key`` field, else its ground truth's (verl-mopd's ground truth names it),
    else ``unknown``."""
    samples = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise UsageError(f"{path}:{n}: not JSON ({exc.msg} at column {exc.colno})") from exc
                if not isinstance(record, dict) or "output" not in record:
                    raise UsageError(f"{path}:{n}: not a verl rollout record: expected a JSON object with 'output' "
                                     "(and input, gts, score, step: verl's trainer.rollout_data_dir)")
                step = record.get("step", int(_ROLLOUT_FILE.match(path.name).group(1)))
                score = record.get("score")
                samples.append(Sample(step=int(step), platform=_platform_of(record, routing_key) or "unknown",
                                      uid=str(record.get("uid", f"{path.name}:{n}")),
                                      score=None if score is None else float(score),
                                      text=str(record["output"]), prompt=record.get("input"), key=f"{path.name}:{n}"))
    return samples


def read_dumps(folder: str | os.PathLike, routing_key: str = "platform") -> Dumps:
    """The dumps of ``folder`` (:func:`find_dumps`), read."""
    kind, where, files = find_dumps(folder)
    if kind == "step":
        samples, padding = read_step_dumps(files)
        return Dumps(kind, where, files, samples, padding)
    return Dumps(kind, where, files, read_rollout_dumps(files, routing_key))

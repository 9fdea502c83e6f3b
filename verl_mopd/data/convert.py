"""Cleaned trajectories -> verl parquet: RL step prompts (stage 2) and SFT samples (stage 1, per platform).

RL step samples (one row per step; read by verl's ``RLHFDataset``, ``data.prompt_key=prompt``,
``data.image_key=images``):

=================  ==========================================================================
column             content
=================  ==========================================================================
``data_source``    the trajectory's ``source`` or its platform (verl groups val metrics by it)
``prompt``         ``[{"role": "system", "content": system_prompt(platform)},
                   {"role": "user", "content": "Instruction: ...\\n\\nPrevious actions:\\nStep 1:
                   ...\\n\\n<image>"}]`` -- one ``<image>`` placeholder, which ``RLHFDataset.
                   _build_messages`` replaces by ``images[0]``
``images``         ``[{"bytes": <PNG/JPEG bytes>}]`` (``image_mode="bytes"``, self-contained) or
                   ``[{"image": "/abs/path.png"}]`` (``"path"``); plus ``min_pixels`` /
                   ``max_pixels`` when set, which ``qwen_vl_utils.fetch_image`` reads
``ability``        ``"gui_agent"``
``reward_model``   ``{"style": "rule", "ground_truth": json.dumps({"platform", "action":
                   {"action": NAME, ...args on the 0-1000 grid}, "bbox"?: [x1, y1, x2, y2]})}``,
                   the layout :func:`verl_mopd.rewards.compute_score` reads
``extra_info``     ``{"platform", "id" (trajectory), "index" (step), "step_id"
                   ("<id>:<index>"), "num_steps", "bbox" (grid box or null), "split"}``
``platform``       top level, the routing key of verl's ``distillation.teacher_key``
=================  ==========================================================================

SFT samples (verl 0.9.1 ``MultiTurnSFTDataset``, ``data.messages_key=messages``,
``data.image_key=images``): ``messages`` = the same system and user turns plus the assistant
turn ``"<think>\\n{thought}\\n</think>\\n\\n<tool_call>\\n{...}\\n</tool_call>"`` (Qwen3-VL
Thinking format, the tool call from :func:`verl_mopd.rewards.render_tool_call`), ``images`` as
above, and ``platform``, ``data_source``, ``extra_info``. One file set per platform (one teacher
each).

History: previous steps of the same trajectory, each its ``description`` if it has one, else its
tool call's JSON. Split: by trajectory, never by step, per platform, seeded.

Output layout under ``out_dir``: ``rl/{train,val}.parquet``, ``sft/<platform>/{train,val}.parquet``,
``cleaned.jsonl``, ``report.json``, ``dropped.jsonl``, ``manifest.json``.
"""

from __future__ import annotations

import json
import os
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from verl_mopd.data.trajectories import Trajectory, step_action, step_bbox
from verl_mopd.rewards.actions import DEFAULT_PROMPT_ACTIONS, PLATFORMS
from verl_mopd.rewards.prompts import render_tool_call, system_prompt

IMAGE_MODES = ("bytes", "path")
ABILITY = "gui_agent"


@dataclass(frozen=True)
class ConvertConfig:
    """How rows are built.

    Attributes:
        val_fraction: share of each platform's trajectories in the val split (0: no val).
        seed: the split's shuffle seed.
        image_mode: ``"bytes"`` (images inside the parquet) or ``"path"`` (absolute paths).
        min_pixels, max_pixels: optional per-image resize bounds for ``qwen_vl_utils``.
        max_history: at most this many previous actions in the prompt (None: all).
        action_sets: per platform, the actions the system prompt offers (the student's action set).
        workers: threads reading image files.
    """

    val_fraction: float = 0.05
    seed: int = 0
    image_mode: str = "bytes"
    min_pixels: int | None = None
    max_pixels: int | None = None
    max_history: int | None = None
    action_sets: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_PROMPT_ACTIONS))
    workers: int = 4

    def __post_init__(self):
        errors = []
        if not (isinstance(self.val_fraction, (int, float)) and 0 <= self.val_fraction < 1):
            errors.append(f"val_fraction={self.val_fraction!r}: must be in [0, 1)")
        if self.image_mode not in IMAGE_MODES:
            errors.append(f"image_mode={self.image_mode!r}: allowed {list(IMAGE_MODES)}")
        for name in ("min_pixels", "max_pixels", "max_history"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                errors.append(f"{name}={v!r}: must be None or an integer >= 0")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            errors.append(f"workers={self.workers!r}: must be an integer >= 1")
        if errors:
            raise ValueError("invalid conversion config: " + "; ".join(errors))


# ----------------------------------------------------------------------------- rows


def history_lines(t: Trajectory, upto: int, cfg: ConvertConfig) -> list[str]:
    """``Step k: ...`` for the steps before position ``upto`` (1-based step numbers)."""
    lines = []
    for k, s in enumerate(t.steps[:upto], 1):
        if s.description:
            what = s.description
        else:
            what = json.dumps(step_action(t, s).to_arguments(), ensure_ascii=False)
        lines.append(f"Step {k}: {what}")
    if cfg.max_history is not None:
        lines = lines[len(lines) - cfg.max_history :] if cfg.max_history else []
    return lines


def user_content(t: Trajectory, upto: int, cfg: ConvertConfig) -> str:
    history = "\n".join(history_lines(t, upto, cfg)) or "None"
    return f"Instruction: {t.instruction}\n\nPrevious actions:\n{history}\n\n<image>"


def assistant_content(thought: str, tool_call: str) -> str:
    """Qwen3-VL Thinking: the reasoning inside ``<think>``, then the call."""
    return f"<think>\n{thought.strip()}\n</think>\n\n{tool_call}"


def ground_truth(t: Trajectory, i: int) -> dict[str, Any]:
    s = t.steps[i]
    gt: dict[str, Any] = {"platform": t.platform, "action": step_action(t, s).to_arguments()}
    box = step_bbox(t, s)
    if box is not None:
        gt["bbox"] = box
    return gt


def _image_entry(path: str, data: bytes | None, cfg: ConvertConfig) -> dict[str, Any]:
    entry: dict[str, Any] = {"bytes": data} if cfg.image_mode == "bytes" else {"image": os.path.abspath(path)}
    if cfg.min_pixels is not None:
        entry["min_pixels"] = cfg.min_pixels
    if cfg.max_pixels is not None:
        entry["max_pixels"] = cfg.max_pixels
    return entry


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def trajectory_rows(
    t: Trajectory, split: str, cfg: ConvertConfig, images: Mapping[str, bytes] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(rl_rows, sft_rows)`` of one trajectory, one of each per step.

    ``images``: screenshot bytes by path (read here when missing and ``image_mode="bytes"``).
    """
    system = system_prompt(t.platform, cfg.action_sets.get(t.platform))
    source = t.source or t.platform
    rl, sft = [], []
    for i, s in enumerate(t.steps):
        data = None
        if cfg.image_mode == "bytes":
            data = images[s.screenshot] if images and s.screenshot in images else _read(s.screenshot)
        prompt = [{"role": "system", "content": system}, {"role": "user", "content": user_content(t, i, cfg)}]
        gt = ground_truth(t, i)
        extra = {
            "platform": t.platform,
            "id": t.id,
            "index": s.index,
            "step_id": f"{t.id}:{s.index}",
            "num_steps": t.num_steps,
            "bbox": gt.get("bbox"),
            "split": split,
        }
        rl.append(
            {
                "data_source": source,
                "prompt": prompt,
                "images": [_image_entry(s.screenshot, data, cfg)],
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": json.dumps(gt, ensure_ascii=False)},
                "extra_info": extra,
                "platform": t.platform,
            }
        )
        call = render_tool_call(step_action(t, s))
        sft.append(
            {
                "data_source": source,
                "messages": [*prompt, {"role": "assistant", "content": assistant_content(s.thought, call)}],
                "images": [_image_entry(s.screenshot, data, cfg)],
                "extra_info": extra,
                "platform": t.platform,
            }
        )
    return rl, sft


# ----------------------------------------------------------------------------- split and write


def split_by_trajectory(trajectories: Sequence[Trajectory], val_fraction: float, seed: int) -> dict[str, str]:
    """``{trajectory id: "train" | "val"}``; per platform, ``round(n * val_fraction)`` to val (at least 1
    when ``val_fraction > 0`` and the platform has >= 2 trajectories). Independent of input order."""
    out: dict[str, str] = {}
    for p in PLATFORMS:
        ids = sorted(t.id for t in trajectories if t.platform == p)
        random.Random(f"{seed}:{p}").shuffle(ids)
        n_val = round(len(ids) * val_fraction)
        if val_fraction > 0 and len(ids) >= 2:
            n_val = min(max(n_val, 1), len(ids) - 1)
        for k, tid in enumerate(ids):
            out[tid] = "val" if k < n_val else "train"
    return out


def write_parquet(rows: Sequence[Mapping[str, Any]], path: str, progress: bool = False) -> int:
    """Rows -> parquet via HF ``datasets`` (atomic: temp file + rename). Returns the row count."""
    import datasets
    from datasets.utils import logging as ds_logging

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp"
    was_enabled = ds_logging.is_progress_bar_enabled()
    if not progress:
        ds_logging.disable_progress_bar()
    try:
        datasets.Dataset.from_list(list(rows)).to_parquet(tmp)
    finally:
        if was_enabled:
            ds_logging.enable_progress_bar()
    os.replace(tmp, path)
    return len(rows)


def load_images(paths: Iterable[str], workers: int, progress: bool = False) -> dict[str, bytes]:
    """Read every distinct file with ``workers`` threads (image I/O dominates conversion time)."""
    unique = list(dict.fromkeys(paths))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        it = pool.map(_read, unique)
        if progress:
            from tqdm import tqdm

            it = tqdm(it, total=len(unique), desc="images", unit="img")
        return dict(zip(unique, it))


def convert(
    trajectories: Sequence[Trajectory], out_dir: str, cfg: ConvertConfig | None = None, progress: bool = False
) -> dict[str, Any]:
    """Write the RL and per-platform SFT parquet files; returns ``{"files": {relpath: rows}, "split": ...}``."""
    cfg = cfg or ConvertConfig()
    split = split_by_trajectory(trajectories, cfg.val_fraction, cfg.seed)
    images: dict[str, bytes] = {}
    if cfg.image_mode == "bytes":
        images = load_images((s.screenshot for t in trajectories for s in t.steps), cfg.workers, progress)
    rl: dict[str, list] = {"train": [], "val": []}
    sft: dict[tuple[str, str], list] = {}
    it: Iterable[Trajectory] = trajectories
    if progress:
        from tqdm import tqdm

        it = tqdm(trajectories, desc="convert", unit="traj")
    for t in it:
        part = split[t.id]
        rl_rows, sft_rows = trajectory_rows(t, part, cfg, images)
        rl[part] += rl_rows
        sft.setdefault((t.platform, part), []).extend(sft_rows)
    files: dict[str, int] = {}
    for part, rows in rl.items():
        if rows:
            files[f"rl/{part}.parquet"] = write_parquet(rows, os.path.join(out_dir, "rl", f"{part}.parquet"), progress)
    for (platform, part), rows in sorted(sft.items()):
        rel = f"sft/{platform}/{part}.parquet"
        files[rel] = write_parquet(rows, os.path.join(out_dir, rel), progress)
    counts = {
        p: {part: sum(1 for t in trajectories if t.platform == p and split[t.id] == part) for part in ("train", "val")}
        for p in PLATFORMS
    }
    return {"files": files, "split_trajectories": counts}


__all__ = [
    "ABILITY",
    "IMAGE_MODES",
    "ConvertConfig",
    "assistant_content",
    "convert",
    "ground_truth",
    "history_lines",
    "load_images",
    "split_by_trajectory",
    "trajectory_rows",
    "user_content",
    "write_parquet",
]

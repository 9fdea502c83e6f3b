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

Memory: rows are streamed, one trajectory at a time, into one ``pyarrow.parquet.ParquetWriter``
per file; a writer flushes a row group every :data:`ROW_GROUP_BYTES` of buffered rows (image
bytes included), so peak memory is bounded by about six row groups (one per open file) whatever
the number of steps. Images are read through :func:`verl_mopd.data.images.read_screenshot`
(refused paths are never opened; with an :class:`~verl_mopd.data.images.ImageIndex`, bytes that
changed since they were checked are refused). The schema is fixed (:func:`rl_schema`,
:func:`sft_schema`), so every row group of a file agrees. Text columns are dictionary-encoded
(each row repeats its platform's system prompt); image bytes are stored plain.

Output layout under ``out_dir``: ``rl/{train,val}.parquet``, ``sft/<platform>/{train,val}.parquet``
(``verl-mopd prepare`` adds ``cleaned.jsonl``, ``report.json``, ``dropped.jsonl``,
``manifest.json``).
"""

from __future__ import annotations

import json
import os
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from verl_mopd.data.images import ImageIndex, read_screenshot
from verl_mopd.data.schema import Step, Trajectory, step_action, step_bbox
from verl_mopd.errors import ConfigError
from verl_mopd.rewards.actions import DEFAULT_PROMPT_ACTIONS, PLATFORMS
from verl_mopd.rewards.prompts import USER_TEMPLATE, render_tool_call, system_prompt

IMAGE_MODES = ("bytes", "path")
ABILITY = "gui_agent"
ROW_GROUP_BYTES = 32 << 20  # buffered bytes per file before a row group is written
ROW_GROUP_ROWS = 2048


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
            raise ConfigError(errors, "conversion config")


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
    return USER_TEMPLATE.format(instruction=t.instruction, history=history)


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


def trajectory_rows(
    t: Trajectory, split: str, cfg: ConvertConfig, images: Mapping[str, bytes] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(rl_rows, sft_rows)`` of one trajectory, one of each per step.

    ``images``: screenshot bytes by path (read here, through the path check, when missing and
    ``image_mode="bytes"``).
    """
    system = system_prompt(t.platform, cfg.action_sets.get(t.platform))
    source = t.source or t.platform
    rl, sft = [], []
    for i, s in enumerate(t.steps):
        data = None
        if cfg.image_mode == "bytes":
            data = images[s.screenshot] if images and s.screenshot in images else read_screenshot(s)
        elif s.path_error:
            read_screenshot(s)  # raises: a refused path is not written into the parquet either
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
        image = [_image_entry(s.screenshot, data, cfg)]
        rl.append(
            {
                "data_source": source,
                "prompt": prompt,
                "images": image,
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
                "images": image,
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


def _messages_type():
    import pyarrow as pa

    return pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def _images_type(cfg: ConvertConfig):
    import pyarrow as pa

    fields = [("bytes", pa.binary())] if cfg.image_mode == "bytes" else [("image", pa.string())]
    fields += [(name, pa.int64()) for name in ("min_pixels", "max_pixels") if getattr(cfg, name) is not None]
    return pa.list_(pa.struct(fields))


def _extra_type():
    import pyarrow as pa

    return pa.struct(
        [("platform", pa.string()), ("id", pa.string()), ("index", pa.int64()), ("step_id", pa.string()),
         ("num_steps", pa.int64()), ("bbox", pa.list_(pa.float64())), ("split", pa.string())]
    )  # fmt: skip


def rl_schema(cfg: ConvertConfig):
    """The RL parquet's pyarrow schema (module docstring)."""
    import pyarrow as pa

    return pa.schema(
        [("data_source", pa.string()), ("prompt", _messages_type()), ("images", _images_type(cfg)),
         ("ability", pa.string()), ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
         ("extra_info", _extra_type()), ("platform", pa.string())]
    )  # fmt: skip


def sft_schema(cfg: ConvertConfig):
    """The SFT parquet's pyarrow schema (module docstring)."""
    import pyarrow as pa

    return pa.schema(
        [("data_source", pa.string()), ("messages", _messages_type()), ("images", _images_type(cfg)),
         ("extra_info", _extra_type()), ("platform", pa.string())]
    )  # fmt: skip


def _text_columns(schema) -> list[str]:
    """Leaf column paths to dictionary-encode: every string leaf (not the image bytes)."""
    import pyarrow as pa

    out = []

    def walk(t, path):
        if pa.types.is_struct(t):
            for f in t:
                walk(f.type, f"{path}.{f.name}")
        elif pa.types.is_list(t):
            walk(t.value_type, f"{path}.list.element")
        elif pa.types.is_string(t):
            out.append(path)

    for f in schema:
        walk(f.type, f.name)
    return out


class ParquetSink:
    """Rows -> one parquet file, written a row group at a time (bounded memory).

    The file appears only on :meth:`close` (temp file + rename); :meth:`abort` removes the temp file.
    """

    def __init__(self, path: str, schema, max_bytes: int = ROW_GROUP_BYTES, max_rows: int = ROW_GROUP_ROWS):
        self.path, self.schema, self.max_bytes, self.max_rows = path, schema, max_bytes, max_rows
        self.tmp = f"{path}.tmp"
        self.rows: list[dict[str, Any]] = []
        self.nbytes = 0
        self.count = 0
        self._writer = None

    def add(self, row: dict[str, Any], nbytes: int) -> None:
        self.rows.append(row)
        self.nbytes += nbytes
        if self.nbytes >= self.max_bytes or len(self.rows) >= self.max_rows:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist(self.rows, schema=self.schema)
        if self._writer is None:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            self._writer = pq.ParquetWriter(self.tmp, self.schema, use_dictionary=_text_columns(self.schema))
        self._writer.write_table(table, row_group_size=len(self.rows))
        self.count += len(self.rows)
        self.rows, self.nbytes = [], 0

    def close(self) -> int:
        self.flush()
        if self._writer is not None:
            self._writer.close()
            os.replace(self.tmp, self.path)
        return self.count

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if os.path.exists(self.tmp):
            os.remove(self.tmp)


def _row_bytes(row: Mapping[str, Any]) -> int:
    n = sum(len(m["content"]) for m in row.get("prompt") or row.get("messages") or ())
    return n + sum(len(im.get("bytes") or b"") for im in row["images"])


def convert(
    trajectories: Sequence[Trajectory],
    out_dir: str,
    cfg: ConvertConfig | None = None,
    progress: bool = False,
    images: ImageIndex | None = None,
) -> dict[str, Any]:
    """Write the RL and per-platform SFT parquet files, streaming (module docstring).

    Returns ``{"files": {relpath: rows}, "split_trajectories": {platform: {"train": n, "val": n}}}``.
    ``images``: the index the ``screenshots`` rule checked; bytes read here must match it.
    """
    cfg = cfg or ConvertConfig()
    split = split_by_trajectory(trajectories, cfg.val_fraction, cfg.seed)
    sinks: dict[str, ParquetSink] = {}

    def sink(rel: str, schema) -> ParquetSink:
        if rel not in sinks:
            sinks[rel] = ParquetSink(os.path.join(out_dir, rel), schema)
        return sinks[rel]

    def read(step: Step) -> bytes:
        expect = images.of(step).sha256 if images is not None and not step.path_error else None
        return read_screenshot(step, expect or None)

    rl_type, sft_type = rl_schema(cfg), sft_schema(cfg)
    it: Iterable[Trajectory] = trajectories
    if progress:
        from tqdm import tqdm

        it = tqdm(trajectories, desc="convert", unit="traj")
    try:
        with ThreadPoolExecutor(max_workers=cfg.workers) as pool:
            for t in it:
                part = split[t.id]
                data = None
                if cfg.image_mode == "bytes":
                    data = dict(zip((s.screenshot for s in t.steps), pool.map(read, t.steps), strict=True))
                rl_rows, sft_rows = trajectory_rows(t, part, cfg, data)
                for row in rl_rows:
                    sink(f"rl/{part}.parquet", rl_type).add(row, _row_bytes(row))
                for row in sft_rows:
                    sink(f"sft/{t.platform}/{part}.parquet", sft_type).add(row, _row_bytes(row))
        files = {rel: sinks[rel].close() for rel in sorted(sinks)}
    except BaseException:
        for s in sinks.values():
            s.abort()
        raise
    counts = {
        p: {part: sum(1 for t in trajectories if t.platform == p and split[t.id] == part) for part in ("train", "val")}
        for p in PLATFORMS
    }
    return {"files": files, "split_trajectories": counts}


__all__ = [
    "ABILITY",
    "IMAGE_MODES",
    "ROW_GROUP_BYTES",
    "ConvertConfig",
    "ParquetSink",
    "assistant_content",
    "convert",
    "ground_truth",
    "history_lines",
    "rl_schema",
    "sft_schema",
    "split_by_trajectory",
    "trajectory_rows",
    "user_content",
]

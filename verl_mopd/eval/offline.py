"""Offline step-level evaluation: a verl parquet of step prompts -> model -> the reward's verdicts -> metrics.

Each row of the parquet (``verl-mopd prepare``'s RL step samples: ``data_source``, ``prompt``,
``images``, ``reward_model.ground_truth``, ``extra_info``, ``platform``) is sent to a client
(:mod:`verl_mopd.clients`) with its screenshots interleaved exactly as verl's RLHFDataset
does, and the response is scored by :func:`verl_mopd.rewards.compute_score`, the function the RL
reward calls, with the same mode and keyword arguments. Nothing is re-implemented: parse rate,
action match and step success are the reward's own ``parsed`` / ``action_match`` / ``acc``.

Metrics, per platform and over all (:func:`metrics`):

- ``parse_rate``: responses with a valid tool call for the platform;
- ``action_type_acc``: the predicted action name equals the ground truth's;
- ``grounding_acc``: over steps whose ground truth points at the screen (a coordinate), the
  predicted point (any action, when it has one) passes the reward's own point rule
  (:func:`verl_mopd.rewards.score.point_match`: inside the box enlarged by ``bbox_scale``, else
  within ``point_tolerance``); ``n_grounding`` says how many steps count;
- ``step_success``: fully correct steps (the reward's ``acc``);
- ``mean_score`` and ``reward_hist``: the count of each reward value (+1.0 / -0.5 / -1.0 by
  default); ``reasons``: the reward's reason tags, most common first.

Resumable: every finished sample is appended (and flushed) to ``results.jsonl`` keyed by its id;
a rerun with the same output folder skips those ids. Requests that fail for good are counted in
the report (``failed``) and not written, so a rerun retries them. ``run.json`` records what
produced the results (the model: ``base_url`` + ``model`` or ``hf_model``; sampling; reward
mode and kwargs): a rerun that differs is refused, naming the difference, so one report never
mixes two models. A torn last line (a crash mid-write) is cut off before appending; a broken
line before it is an error naming ``results.jsonl:N``. One process writes a folder at a time
(a lock on ``results.jsonl``); ``report.json`` and ``run.json`` are written atomically.

Images: a relative path is resolved against the data file's folder, and every path must lie
inside ``image_root`` (default: that folder; symlinks resolved). Every image, ``bytes`` included,
must pass ``prepare``'s image check (a PNG, JPEG or WebP that Pillow reads through,
:func:`verl_mopd.data.images.identify`), so no other local file is ever sent.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from verl_mopd.data.images import DataRoots, identify
from verl_mopd.errors import UsageError
from verl_mopd.eval.messages import expand_images
from verl_mopd.files import atomic_write, json_line, json_text
from verl_mopd.rewards import compute_score, parse_action, summarize
from verl_mopd.rewards.score import make_configs, point_match, read_ground_truth, strict_targets, to_plain

REQUIRED_COLUMNS = ("prompt", "reward_model")


@dataclass(frozen=True)
class StepSample:
    """One step prompt. ``messages`` are neutral messages (:mod:`verl_mopd.eval.messages`)."""

    id: str
    platform: str
    data_source: Any
    messages: list[dict[str, Any]]
    ground_truth: Any
    extra_info: dict[str, Any]


def sample_id(extra: Mapping[str, Any], index: int) -> str:
    """A step's key: ``extra_info.step_id`` (``prepare`` writes ``"<trajectory>:<step>"``), else
    ``"<id>:<index>"``, else ``id``, else ``index``, else the row number."""
    if extra.get("step_id") is not None:
        return str(extra["step_id"])
    if extra.get("id") is not None and extra.get("index") is not None:
        return f"{extra['id']}:{extra['index']}"
    for key in ("id", "index"):
        if extra.get(key) is not None:
            return str(extra[key])
    return str(index)


def checked_image(data: bytes, where: str) -> bytes:
    """``data`` if it is a usable image (``verl_mopd.data.images.identify``: the formats and checks
    of ``prepare``'s ``screenshots`` rule), else ValueError naming ``where``."""
    try:
        identify(data)
    except ValueError as e:
        raise ValueError(f"{where}: not an image ({e})") from None
    return data


def image_folders(base: str, image_root: str | None = None) -> DataRoots:
    """Where image paths in the data are read: relative ones against ``base`` (the data file's
    folder), and every one, resolved with symlinks, only inside ``image_root`` (default ``base``)."""
    return DataRoots(os.path.abspath(base), (os.path.realpath(image_root if image_root is not None else base),))


def _image_file(path: str, folders: DataRoots, where: str) -> bytes:
    """Read an image path from the data, resolved against the data folder and kept inside the root."""
    if path.startswith("file://"):
        path = path[len("file://") :]
    full, refused = folders.resolve(path)
    if refused:
        raise ValueError(f"{where}={path!r} {refused}; images are read only below it")
    if not os.path.isfile(full):
        raise ValueError(f"{where}={path!r}: no such image file ({full})")
    with open(full, "rb") as f:
        return checked_image(f.read(), where)


def _resolve_image(image: Any, folders: DataRoots, where: str) -> Any:
    """An ``images`` entry (or an inline prompt image) with any path replaced by checked bytes."""
    if isinstance(image, (bytes, bytearray)):
        return checked_image(bytes(image), where)
    if isinstance(image, str):
        return _image_file(image, folders, where)
    if isinstance(image, Mapping):
        if image.get("bytes") is not None:
            return {**image, "bytes": checked_image(bytes(image["bytes"]), where)}
        for key in ("path", "image"):
            if image.get(key) is not None:
                return {"bytes": _as_bytes(_resolve_image(image[key], folders, f"{where}.{key}"))}
    return image  # expand_images names what is wrong with it


def _as_bytes(resolved: Any) -> bytes:
    return resolved["bytes"] if isinstance(resolved, Mapping) else resolved


def _resolve_prompt(prompt: Any, folders: DataRoots) -> Any:
    """Inline images of list-form prompt contents, resolved as :func:`_resolve_image` does."""
    if not isinstance(prompt, list):
        return prompt
    out = []
    for i, message in enumerate(prompt):
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, Mapping) and part.get("type") == "image" and part.get("image") is not None:
                    part = {**part, "image": _as_bytes(_resolve_image(part["image"], folders, f"prompt[{i}].image"))}
                parts.append(part)
            message = {**message, "content": parts}
        out.append(message)
    return out


def sample_from_row(row: Mapping[str, Any], index: int, images: DataRoots | None = None) -> StepSample:
    """A parquet row -> :class:`StepSample`; raises ValueError naming the row and field.

    ``images``: where image paths are read (default: relative to and inside the current directory).
    """
    folders = images if images is not None else image_folders(os.getcwd())
    row = {k: to_plain(v) for k, v in row.items()}
    missing = [c for c in REQUIRED_COLUMNS if c not in row]
    if missing:
        raise ValueError(f"row {index}: missing columns {missing}; a verl RL parquet has {list(REQUIRED_COLUMNS)}")
    rm = row["reward_model"]
    if not isinstance(rm, dict) or "ground_truth" not in rm:
        raise ValueError(f"row {index}: reward_model={rm!r}: expected {{'style': 'rule', 'ground_truth': ...}}")
    extra = row.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise ValueError(f"row {index}: extra_info is a {type(extra).__name__}, expected a dict")
    gt = rm["ground_truth"]
    platform = row.get("platform") or extra.get("platform")
    if platform is None:
        try:
            platform = read_ground_truth(gt, extra).platform
        except ValueError as e:
            raise ValueError(f"row {index}: no 'platform' column and {e}") from None
    sid = sample_id(extra, index)
    try:
        entries = row.get("images")
        if isinstance(entries, list):
            entries = [_resolve_image(im, folders, f"images[{i}]") for i, im in enumerate(entries)]
        messages = expand_images(_resolve_prompt(row["prompt"], folders), entries)
    except ValueError as e:
        raise ValueError(f"row {index} (id={sid!r}): {e}") from None
    return StepSample(sid, str(platform), row.get("data_source"), messages, gt, extra)


def load_samples(
    path: str, limit: int | None = None, platforms: Iterable[str] | None = None, image_root: str | None = None
) -> list[StepSample]:
    """Read a verl parquet (a file or a folder of ``*.parquet``); ids must be unique.

    ``image_root``: see the module docstring (default: the folder of the data).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not os.path.exists(path):
        raise UsageError(f"--data={path}: no such file or folder")
    is_dir = os.path.isdir(path)
    files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".parquet")) if is_dir else [path]
    if not files:
        raise UsageError(f"--data={path}: no .parquet files in the folder")
    base = path if is_dir else os.path.dirname(os.path.abspath(path))
    folders = image_folders(base, image_root)
    keep = set(platforms) if platforms else None
    samples: list[StepSample] = []
    n = 0
    for f in files:
        try:
            table = pq.read_table(f)
        except (pa.ArrowException, OSError) as e:
            raise UsageError(f"{f}: not a readable parquet file ({e})") from None
        for row in table.to_pylist():
            try:
                s = sample_from_row(row, n, folders)
            except ValueError as e:
                raise UsageError(f"{f}: {e}") from None
            n += 1
            if keep is not None and s.platform not in keep:
                continue
            samples.append(s)
            if limit is not None and len(samples) >= limit:
                break
        if limit is not None and len(samples) >= limit:
            break
    dup = [k for k, c in Counter(s.id for s in samples).items() if c > 1]
    if dup:
        raise ValueError(f"{path}: duplicate sample ids {dup[:5]} (extra_info.step_id must be unique for resumable results)")
    return samples


def score_sample(sample: StepSample, response: str, mode: str = "strict", **reward_kwargs: Any) -> dict[str, Any]:
    """The reward's verdict for one response plus the grounding verdict; one JSON-able record."""
    r = compute_score(sample.data_source, response, sample.ground_truth, sample.extra_info, mode, **reward_kwargs)
    grounding = _grounding(sample, response, mode, reward_kwargs)
    return {
        "id": sample.id,
        "platform": sample.platform,
        "response": response,
        **{k: r[k] for k in ("score", "acc", "parsed", "action_match", "args_match", "reason", "thought_length")},
        "grounding": grounding,
    }


def _grounding(sample: StepSample, response: str, mode: str, reward_kwargs: Mapping[str, Any]) -> float | None:
    """1.0/0.0 when the ground truth has a coordinate, else None (the step does not count)."""
    score_cfg, parse_cfg = make_configs(**({} if mode == "ui_mopd" else reward_kwargs))
    try:
        target = strict_targets(read_ground_truth(sample.ground_truth, sample.extra_info))[0]
    except ValueError:
        return None
    if target.action.coordinate is None:
        return None
    pred = parse_action(response, sample.platform, parse_cfg)
    point = getattr(pred, "coordinate", None) if pred else None
    return 1.0 if point is not None and point_match(point, target.action.coordinate, target.bbox, score_cfg) else 0.0


def metrics(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per-platform (and ``"all"``) metrics of scored records; see the module docstring."""
    records = list(records)
    base = summarize(records) if records else {}
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault(r["platform"], []).append(r)
        groups.setdefault("all", []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for platform in sorted(groups, key=lambda p: (p == "all", p)):
        rs = groups[platform]
        n = len(rs)
        g = [r["grounding"] for r in rs if r.get("grounding") is not None]
        hist = Counter(float(r["score"]) for r in rs)
        out[platform] = {
            "n": n,
            "parse_rate": sum(r["parsed"] for r in rs) / n,
            "action_type_acc": sum(r["action_match"] for r in rs) / n,
            "grounding_acc": (sum(g) / len(g)) if g else None,
            "n_grounding": len(g),
            "step_success": sum(r["acc"] for r in rs) / n,
            "mean_score": base[platform]["score"],
            "reward_hist": {f"{k:+g}": v for k, v in sorted(hist.items(), reverse=True)},
            "reasons": base[platform]["reasons"],
        }
    return out


COLUMNS = (
    ("n", "n", "{}"),
    ("parse", "parse_rate", "{:.1%}"),
    ("action", "action_type_acc", "{:.1%}"),
    ("ground", "grounding_acc", "{:.1%}"),
    ("success", "step_success", "{:.1%}"),
    ("score", "mean_score", "{:+.3f}"),
)


def format_table(report: Mapping[str, Mapping[str, Any]]) -> str:
    """A Markdown table of :func:`metrics` output, one row per platform (``all`` last)."""
    head = ["platform", *(c[0] for c in COLUMNS), "reward histogram"]
    rows = []
    for platform, m in report.items():
        cells = [platform]
        for _, key, fmt in COLUMNS:
            v = m[key]
            cells.append("-" if v is None else fmt.format(v))
        cells.append(" ".join(f"{k}:{v}" for k, v in m["reward_hist"].items()))
        rows.append(cells)
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def read_results(path: str) -> dict[str, dict[str, Any]]:
    """Finished records of a ``results.jsonl`` by id; a torn last line (a crash mid-write) is
    skipped, a broken line before it is a ValueError naming ``path:line``."""
    done: dict[str, dict[str, Any]] = {}
    if not os.path.exists(path):
        return done
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            key = str(rec["id"])
        except (ValueError, KeyError, TypeError):
            if i == len(lines) - 1:  # no newline after it: the write was cut short
                continue
            raise ValueError(f"{path}:{i + 1}: not a result record; delete the line or the file to start over") from None
        done[key] = rec
    return done


def _cut_torn_tail(path: str) -> None:
    """Drop an unterminated last line (a write cut short), so the next record starts a line."""
    if not os.path.exists(path):
        return
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(max(0, size - 1))
        if f.read(1) == b"\n":
            return
        block, end = 1 << 16, size
        while end > 0:  # find the last newline
            start = max(0, end - block)
            f.seek(start)
            chunk = f.read(end - start)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                f.truncate(start + cut + 1)
                return
            end = start
        f.truncate(0)


RUN_FILE = "run.json"


def _check_run(out_dir: str, run: Mapping[str, Any], has_results: bool) -> None:
    """Refuse to resume results that another model, sampling or reward setting produced."""
    if not has_results:
        return
    path = os.path.join(out_dir, RUN_FILE)
    before: Any = None
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                before = json.load(f)
        except ValueError:
            before = None
    if before == json.loads(json.dumps(run)):
        return
    if not isinstance(before, dict):
        what = f"{RUN_FILE} is missing or unreadable, so what produced them is unknown"
    else:
        keys = sorted(set(before) | set(run), key=str)
        what = ", ".join(f"{k} {before.get(k)!r} (now {run.get(k)!r})" for k in keys if before.get(k) != run.get(k))
    raise UsageError(
        f"--out={out_dir} holds results of another run: {what}. Choose another --out, or delete "
        f"{os.path.join(out_dir, 'results.jsonl')} to start over"
    )


@contextlib.contextmanager
def _locked_append(path: str):
    """``results.jsonl`` opened for appending, with an exclusive lock (one writer per folder)."""
    f = open(path, "a", encoding="utf-8")
    try:
        try:
            import fcntl

            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # not POSIX: no lock
            pass
        except OSError:
            raise UsageError(f"{path}: another evaluation is writing to this --out folder") from None
        yield f
    finally:
        f.close()


def evaluate(
    samples: list[StepSample],
    complete: Callable[[list[dict[str, Any]]], str],
    out_dir: str,
    *,
    max_in_flight: int = 8,
    mode: str = "strict",
    reward_kwargs: Mapping[str, Any] | None = None,
    progress: bool = True,
    meta: Mapping[str, Any] | None = None,
    run: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Query ``complete`` for every sample not already in ``out_dir/results.jsonl``, score, report.

    Writes ``out_dir/results.jsonl`` (appended, one line per finished sample), ``out_dir/run.json``
    and ``out_dir/report.json``; returns the report: ``{"metrics", "counts", "failures", "meta"}``.

    Args:
        run: what produces the responses (model, sampling), e.g. ``{"base_url", "model",
            "max_tokens", "temperature"}``; with ``mode`` and ``reward_kwargs`` it keys the resume:
            results of a different run are refused (module docstring).
    """
    from verl_mopd.clients import run_bounded

    reward_kwargs = dict(reward_kwargs or {})
    compute_score(None, "", '{"platform": "desktop", "action": {"action": "wait"}}', None, mode, **reward_kwargs)
    for s in samples:  # a bad ground truth stops the run before any request, naming the sample
        try:
            compute_score(s.data_source, "", s.ground_truth, s.extra_info, mode, **reward_kwargs)
        except ValueError as e:
            raise ValueError(f"sample {s.id!r}: {e}") from None
    run_key = {**dict(run or {}), "mode": mode, "reward_kwargs": reward_kwargs}
    os.makedirs(out_dir, exist_ok=True)
    results_path = os.path.join(out_dir, "results.jsonl")
    with _locked_append(results_path) as out:
        _cut_torn_tail(results_path)
        done = read_results(results_path)
        _check_run(out_dir, run_key, bool(done))
        with atomic_write(os.path.join(out_dir, RUN_FILE)) as f:
            f.write(json_text(run_key, indent=2))
        ids = {s.id for s in samples}
        todo = [s for s in samples if s.id not in done]
        failures: list[dict[str, Any]] = []
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(samples), initial=len(samples) - len(todo), desc="eval", unit="step")
        for sample, response, err in run_bounded(lambda s: complete(s.messages), todo, max_in_flight):
            if err is not None:
                failures.append({"id": sample.id, "error": f"{type(err).__name__}: {err}"})
            else:
                rec = score_sample(sample, response, mode, **reward_kwargs)
                done[sample.id] = rec
                out.write(json_line(rec))
                out.flush()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(failed=len(failures))
        if bar is not None:
            bar.close()
    records = [done[i] for i in sorted(ids & done.keys())]
    report = {
        "metrics": metrics(records),
        "counts": {
            "samples": len(samples),
            "scored": len(records),
            "resumed": len(samples) - len(todo),
            "failed": len(failures),
            "stale_results_ignored": len(done.keys() - ids),
        },
        "failures": failures[:100],
        "meta": {"mode": mode, "reward_kwargs": reward_kwargs, **(meta or {})},
    }
    with atomic_write(os.path.join(out_dir, "report.json")) as f:
        f.write(json_text(report, indent=2))
    return report

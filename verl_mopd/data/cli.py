"""``verl-mopd prepare``: read trajectories, clean them, write verl parquet and the report.

``verl_mopd/cli.py`` mounts this with :func:`add_prepare_arguments` + :func:`run_prepare`.

    python -m verl_mopd.data.fixtures /tmp/uni_gui
    verl-mopd prepare --input /tmp/uni_gui/trajectories.jsonl --out /tmp/uni_gui/out

Outcome: exit 0 when something was kept; 1 when nothing was kept (no parquet to train on), or
with ``--strict`` when an input line was dropped as ``parse``. A mistake in the command line or
its files raises :class:`PrepareError` (a :class:`~verl_mopd.errors.UsageError` naming the option)
before anything is written: one line and exit code 2 from ``verl-mopd``'s error boundary.

Outputs are replaced as a whole: a run writes into a fresh folder beside ``--out``
(``.<name>.prepare-<pid>-*``) and swaps it in at the end, so ``--out`` holds exactly one run's
files, all listed in ``manifest.json`` with their sizes. An interrupted run (Ctrl-C, an error)
removes its folder and leaves the previous outputs as they were; one killed outright leaves a
folder that the next run removes. Anything else in ``--out`` (the judge cache) is carried over.

Resuming: ``manifest.json`` records a fingerprint of every option, the input files' bytes and
every screenshot's bytes (SHA-256, computed anyway by the image check, so a rerun reads them
again); a rerun with the same fingerprint whose listed files are all there writes nothing and
exits as that run did (``--overwrite`` forces). Judge answers are cached per request (``--judge-cache``), so an
interrupted run resumes without asking the judge again.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import secrets
import shutil
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, Iterator

from verl_mopd.data.clean import (
    MAX_STEPS,
    MISSING_VERDICTS,
    RULES,
    CleanConfig,
    clean,
    clean_report,
    format_report,
)
from verl_mopd.data.convert import IMAGE_MODES, ConvertConfig, convert
from verl_mopd.data.images import ImageIndex
from verl_mopd.data.judges import SCORE_THRESHOLD, JudgeConfig, JudgeError, OfflineJudge, OpenAIJudge
from verl_mopd.data.readers import agentnet_image_dir, read_agentnet, read_android_control
from verl_mopd.data.schema import PARSE, Drop, drop_duplicate_ids, read_jsonl, write_jsonl
from verl_mopd.errors import UsageError
from verl_mopd.files import json_line, json_text

MANIFEST = "manifest.json"
OUTPUTS = ("rl", "sft", "cleaned.jsonl", "dropped.jsonl", "report.json", MANIFEST)  # what a run writes
JUDGE_CACHE = "judge_cache"
SHOW = 10  # problems printed in full; the rest are in dropped.jsonl / report.json


class PrepareError(UsageError):
    """A mistake in the ``prepare`` command line or its files; the message names the option."""


def add_prepare_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    io = parser.add_argument_group("inputs and outputs")
    io.add_argument("--input", action="append", default=[], metavar="JSONL", help="Uni-GUI schema JSONL (repeatable)")
    io.add_argument("--agentnet", action="append", default=[], metavar="JSONL", help="OpenCUA AgentNet JSONL (repeatable)")
    io.add_argument(
        "--agentnet-images", action="append", default=[], metavar="DIR",
        help="AgentNet screenshot folder: one for all --agentnet files, or one per file in the same order "
        "(default: ubuntu_images/ or win_mac_images/ beside the file, as released; else images/)",
    )  # fmt: skip
    io.add_argument(
        "--android-control", action="append", default=[], metavar="PATH",
        help="AndroidControl episodes: a JSONL export, or a TFRecord glob (needs tensorflow) (repeatable)",
    )  # fmt: skip
    io.add_argument("--android-control-images", default=None, metavar="DIR", help="where AndroidControl screenshots are/go")
    io.add_argument("--scroll-is-finger", action="store_true", help="AndroidControl scroll direction is the finger's")
    io.add_argument(
        "--image-root", action="append", default=[], metavar="DIR",
        help="also accept screenshot paths (relative or absolute) that resolve under DIR; by default a path "
        "must stay inside its data root (the JSONL's folder, or the reader's image folder) (repeatable)",
    )  # fmt: skip
    io.add_argument("--out", required=True, metavar="DIR", help="output folder (replaced as a whole by each run)")
    io.add_argument("--overwrite", action="store_true", help="redo even if manifest.json says the outputs are current")
    io.add_argument("--strict", action="store_true", help="exit 1 when any input line could not be read (parse drops)")
    io.add_argument("--workers", type=int, default=4, help="threads for image I/O and judge requests")
    io.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")

    cl = parser.add_argument_group("cleaning")
    cl.add_argument("--skip-rule", action="append", default=[], choices=list(RULES), help="disable a rule (repeatable)")
    cl.add_argument("--max-steps", type=int, default=MAX_STEPS, help="max_steps rule limit (default %(default)s)")
    cl.add_argument(
        "--missing-verdict", choices=list(MISSING_VERDICTS), default=CleanConfig.missing_verdict,
        help="subtasks rule, a trajectory without a verdict: drop it (counted as no_verdict), keep it, or stop "
        "(default %(default)s; AgentNet's task_completed is its verdict, null is none)",
    )  # fmt: skip
    cl.add_argument(
        "--image-check", choices=["verify", "decode"], default="verify",
        help="screenshots rule: verify = PNG chunk CRCs (other formats decoded), decode = decode every image",
    )  # fmt: skip

    jg = parser.add_argument_group("subtask judge (offline unless --judge-base-url)")
    jg.add_argument("--judge-base-url", default=None, help="OpenAI-compatible API root, e.g. http://127.0.0.1:30000/v1")
    jg.add_argument("--judge-model", default=None, help="model name sent to the judge server")
    jg.add_argument("--judge-api-key-env", default="OPENAI_API_KEY", help="env var with the bearer token")
    jg.add_argument("--judge-cache", default=None, metavar="DIR", help=f"answer cache (default <out>/{JUDGE_CACHE})")
    jg.add_argument("--judge-max-images", type=int, default=3, help="last N screenshots sent to the judge")
    jg.add_argument("--judge-threshold", type=float, default=SCORE_THRESHOLD, help="score >= this = completed")
    jg.add_argument("--judge-again", action="store_true", help="ask the judge even where the data has a verdict")

    cv = parser.add_argument_group("conversion")
    cv.add_argument("--val-fraction", type=float, default=0.05, help="val share per platform, by trajectory")
    cv.add_argument("--seed", type=int, default=0, help="split seed")
    cv.add_argument("--image-mode", choices=list(IMAGE_MODES), default="bytes", help="images inside the parquet or paths")
    cv.add_argument("--min-pixels", type=int, default=None,
                    help="per-image lower resize bound written with each image for qwen_vl_utils (default: unset)")
    cv.add_argument("--max-pixels", type=int, default=None,
                    help="per-image upper resize bound written with each image for qwen_vl_utils (default: unset)")
    cv.add_argument("--max-history", type=int, default=None, help="previous actions shown in a prompt (default all)")
    return parser


# ----------------------------------------------------------------------------- checks before any work


def _agentnet_image_dirs(args: argparse.Namespace) -> list[str]:
    given = args.agentnet_images
    if len(given) not in (0, 1, len(args.agentnet)):
        raise PrepareError(
            f"--agentnet-images given {len(given)} times for {len(args.agentnet)} --agentnet files: "
            "give it once (one folder for all) or once per file, in the same order"
        )
    if len(given) == 1:
        dirs = given * len(args.agentnet)
    else:
        dirs = given or [agentnet_image_dir(p) for p in args.agentnet]
    for path, folder in zip(args.agentnet, dirs, strict=True):
        if not os.path.isdir(folder):
            how = "given" if given else "default"
            raise PrepareError(
                f"--agentnet {path}: image folder {folder} ({how}) is not a folder; the released dataset extracts "
                "ubuntu_images/ and win_mac_images/ beside its JSONL files; pass --agentnet-images DIR"
            )
    return dirs


def _input_files(args: argparse.Namespace) -> list[str]:
    """Every input file (TFRecord globs expanded); raises PrepareError for a missing one."""
    files = []
    options = (("--input", args.input), ("--agentnet", args.agentnet), ("--android-control", args.android_control))
    for option, paths in options:
        for p in paths:
            if option == "--android-control" and not p.endswith(".jsonl"):
                matched = sorted(glob.glob(p))
                if not matched:
                    raise PrepareError(f"{option} {p}: no file matches")
                files += matched
            elif not os.path.isfile(p):
                raise PrepareError(f"{option} {p}: {'is a folder, not a file' if os.path.isdir(p) else 'no such file'}")
            else:
                files.append(p)
    return files


def _check_args(args: argparse.Namespace) -> None:
    if not (args.input or args.agentnet or args.android_control):
        raise PrepareError("give at least one of --input, --agentnet, --android-control")
    if args.judge_base_url and not args.judge_model:
        raise PrepareError("--judge-base-url needs --judge-model")
    for root in args.image_root:
        if not os.path.isdir(root):
            raise PrepareError(f"--image-root {root}: not a folder")
    out = args.out
    if os.path.exists(out) and not os.path.isdir(out):
        raise PrepareError(f"--out {out}: exists and is not a folder")
    if os.path.isdir(out) and not os.path.isfile(os.path.join(out, MANIFEST)):
        foreign = [n for n in os.listdir(out) if n != _cache_entry(args)]
        if foreign:
            raise PrepareError(
                f"--out {out}: not empty ({', '.join(sorted(foreign)[:5])}) and not the output of an earlier "
                f"prepare (no {MANIFEST}); prepare replaces its outputs as a whole, so give a new or empty folder"
            )


def _cache_dir(args: argparse.Namespace) -> str:
    return args.judge_cache or os.path.join(args.out, JUDGE_CACHE)


def _cache_entry(args: argparse.Namespace) -> str | None:
    """The top-level name of the judge cache inside --out, if it is there."""
    rel = os.path.relpath(os.path.abspath(_cache_dir(args)), os.path.abspath(args.out))
    return None if rel.startswith("..") else rel.split(os.sep)[0]


# ----------------------------------------------------------------------------- reading, fingerprint


def _read_all(args: argparse.Namespace, agentnet_dirs: list[str], drops: list[Drop]) -> Iterator:
    roots = args.image_root
    for p in args.input:
        yield from read_jsonl(p, drops, roots)
    for p, folder in zip(args.agentnet, agentnet_dirs, strict=True):
        yield from read_agentnet(p, folder, drops=drops, roots=roots)
    for p in args.android_control:
        yield from read_android_control(
            p, args.android_control_images, drops, roots, scroll_is_finger=args.scroll_is_finger
        )


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _option_names() -> list[str]:
    ignored = {"help", "overwrite", "no_progress", "workers"}  # they do not change what is written
    return sorted(a.dest for a in add_prepare_arguments(argparse.ArgumentParser())._actions if a.dest not in ignored)


def _fingerprint(args: argparse.Namespace, files: list[str], trajectories: list, images: ImageIndex) -> str:
    from verl_mopd import __version__

    h = hashlib.sha256(f"verl-mopd {__version__}\n".encode())
    h.update(json.dumps({k: getattr(args, k, None) for k in _option_names()}, sort_keys=True, default=str).encode())
    for path in files:
        h.update(f"\nfile {os.path.abspath(path)} {_file_sha256(path)}".encode())
    for t in trajectories:
        for s in t.steps:
            info = images.of(s)
            content = info.sha256 or (info.problem or "").encode()
            h.update(f"\nimage {s.screenshot} ".encode("utf-8", "replace") + content)
    return h.hexdigest()


def _previous_run(out: str, fingerprint: str) -> dict | None:
    """The manifest of the outputs in ``out`` if they are this run's (same fingerprint, every file there)."""
    try:
        with open(os.path.join(out, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("fingerprint") != fingerprint:
        return None
    files = manifest.get("files")
    if not isinstance(files, dict):
        return None
    for rel, info in files.items():
        path = os.path.join(out, rel)
        if not isinstance(info, dict) or not os.path.isfile(path) or os.path.getsize(path) != info.get("bytes"):
            return None
    return manifest


# ----------------------------------------------------------------------------- writing


def _judge(args: argparse.Namespace):
    if not args.judge_base_url:
        return OfflineJudge(args.judge_threshold)
    return OpenAIJudge(
        JudgeConfig(
            base_url=args.judge_base_url,
            model=args.judge_model,
            api_key_env=args.judge_api_key_env,
            cache_dir=_cache_dir(args),
            max_images=args.judge_max_images,
            threshold=args.judge_threshold,
            workers=args.workers,
            reuse_verdicts=not args.judge_again,
        )
    )


def _write_json(obj: Any, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(json_text(obj, indent=2))


def _staging_prefix(out: str) -> str:
    return f".{os.path.basename(out)}.prepare-"


def _remove_stale_staging(out: str) -> None:
    """Folders of earlier runs that were killed outright (their process is gone)."""
    parent, prefix = os.path.dirname(out), _staging_prefix(out)
    for name in os.listdir(parent) if os.path.isdir(parent) else ():
        pid = name[len(prefix) :].split("-", 1)[0]
        if not (name.startswith(prefix) and pid.isdigit()):
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        except OSError:
            pass  # alive, another user's


@contextmanager
def _sigint_deferred():
    """Ctrl-C waits until the block is done (the swap is a few renames that must not be split)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            raise KeyboardInterrupt


def _swap(staging: str, out: str) -> None:
    """Make ``staging`` the new ``out``; entries of the old ``out`` that are not outputs move along."""
    old = f"{staging}.old"
    with _sigint_deferred():
        if os.path.isdir(out):
            os.replace(out, old)
        try:
            os.replace(staging, out)
        except OSError:
            if os.path.isdir(old):
                os.replace(old, out)  # put the previous outputs back
            raise
        if os.path.isdir(old):
            for name in os.listdir(old):
                if name not in OUTPUTS:
                    os.replace(os.path.join(old, name), os.path.join(out, name))
    shutil.rmtree(old, ignore_errors=True)


def _listing(root: str) -> dict[str, dict[str, int]]:
    files = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            files[os.path.relpath(path, root).replace(os.sep, "/")] = {"bytes": os.path.getsize(path)}
    return dict(sorted(files.items()))


def _input_order(files: list[str]):
    rank = {os.path.abspath(p): i for i, p in enumerate(files)}

    def key(d: Drop) -> tuple[int, int]:
        path, _, line = d.where.rpartition(":")
        return (rank.get(os.path.abspath(path), len(rank)), int(line) if line.isdigit() else 0)

    return key


def _problems(report: dict, drops: list[Drop], judge: Any, strict: bool) -> tuple[int, list[str]]:
    """The exit code and the warnings to print (also stored in the manifest for an up-to-date rerun)."""
    lines, code = [], 0
    parsed = [d for d in drops if d.rule == PARSE]
    if parsed:
        lines.append(f"prepare: {len(parsed)} input line(s) could not be read (dropped as {PARSE!r}):")
        lines += [f"  {d.detail}" for d in parsed[:SHOW]]
        if len(parsed) > SHOW:
            lines.append(f"  ... {len(parsed) - SHOW} more in dropped.jsonl")
        code = 1 if strict else 0
    stats = getattr(judge, "stats", {})
    if stats.get("cache_corrupt"):
        lines.append(f"prepare: {stats['cache_corrupt']} judge cache file(s) were unreadable and asked again:")
        lines += [f"  {p}" for p in stats["cache_corrupt_files"]]
    total = report["total"]
    if total["kept"]["trajectories"] == 0:
        by_rule = {r: c["trajectories"] for r, c in total["dropped"].items() if c["trajectories"]}
        first = drops[0] if drops else None
        lines.append(
            f"prepare: kept 0 of {total['input']['trajectories']} trajectories, so no parquet was written; dropped: "
            + (", ".join(f"{r} {n}" for r, n in by_rule.items()) or "nothing (the input is empty)")
            + (f". First drop: {first.detail}" if first else "")
        )
        if any(d.kind == "no_verdict" for d in drops):
            lines.append(
                "prepare: trajectories without a judge verdict are dropped (--missing-verdict drop): put verdicts "
                "in the data, ask a judge (--judge-base-url), or pass --missing-verdict keep / --skip-rule subtasks"
            )
        code = 1
    return code, lines


def run_prepare(args: argparse.Namespace) -> int:
    _check_args(args)
    out = os.path.realpath(args.out)  # a symlinked --out keeps pointing at the new outputs
    files = _input_files(args)
    agentnet_dirs = _agentnet_image_dirs(args)
    progress = not args.no_progress
    clean_cfg = CleanConfig(
        rules=tuple(r for r in RULES if r not in args.skip_rule),
        max_steps=args.max_steps,
        missing_verdict=args.missing_verdict,
    )
    conv_cfg = ConvertConfig(
        val_fraction=args.val_fraction,
        seed=args.seed,
        image_mode=args.image_mode,
        min_pixels=args.min_pixels,
        max_pixels=args.max_pixels,
        max_history=args.max_history,
        action_sets=clean_cfg.action_sets,
        workers=args.workers,
    )
    parse_drops: list[Drop] = []
    trajectories = list(drop_duplicate_ids(_read_all(args, agentnet_dirs, parse_drops), parse_drops))
    images = ImageIndex(decode=args.image_check == "decode")
    images.scan((s.screenshot for t in trajectories for s in t.steps if not s.path_error), args.workers, progress)
    fingerprint = _fingerprint(args, files, trajectories, images)
    previous = None if args.overwrite else _previous_run(out, fingerprint)
    if previous is not None:
        print(f"prepare: outputs in {args.out} are up to date (same options, inputs and screenshots); "
              "--overwrite to redo")  # fmt: skip
        for line in previous.get("messages", []):
            print(line, file=sys.stderr)
        return int(previous.get("exit_code", 0))

    judge = _judge(args)
    try:
        kept, rule_drops = clean(trajectories, clean_cfg, judge=judge, progress=progress, images=images)
    except JudgeError as e:
        raise PrepareError(f"{e}; answers received so far are cached in {_cache_dir(args)}, a rerun resumes") from None
    drops = sorted([*parse_drops, *rule_drops], key=_input_order(files))
    report = clean_report(trajectories, kept, drops, clean_cfg)
    report["images"] = images.summary()
    if isinstance(judge, OpenAIJudge):
        report["judge"] = {"model": judge.config.model, **judge.stats}
    code, messages = _problems(report, drops, judge, args.strict)

    os.makedirs(os.path.dirname(out), exist_ok=True)
    _remove_stale_staging(out)
    staging = os.path.join(os.path.dirname(out), f"{_staging_prefix(out)}{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.mkdir(staging)  # not mkdtemp: the folder becomes --out, with the umask's permissions
        write_jsonl(kept, os.path.join(staging, "cleaned.jsonl"))
        with open(os.path.join(staging, "dropped.jsonl"), "w", encoding="utf-8") as f:
            for d in drops:
                f.write(json_line(asdict(d)))
        result = convert(kept, staging, conv_cfg, progress=progress, images=images)
        report["outputs"] = result
        _write_json(report, os.path.join(staging, "report.json"))
        listing = _listing(staging)
        for rel, rows in result["files"].items():
            listing[rel]["rows"] = rows
        manifest = {"tool": "verl-mopd prepare", "fingerprint": fingerprint, "exit_code": code, "messages": messages,
                    "files": listing}  # fmt: skip
        _write_json(manifest, os.path.join(staging, MANIFEST))
        _swap(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone after a swap; removed after an error or Ctrl-C
    print(format_report(report))
    for rel, n in result["files"].items():
        print(f"{rel}: {n} rows")
    for line in messages:
        print(line, file=sys.stderr)
    return code

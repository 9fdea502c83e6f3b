"""``verl-mopd prepare``: read trajectories, clean them, write verl parquet and the report.

``verl_mopd/cli.py`` mounts this with :func:`add_prepare_arguments` + :func:`run_prepare`; it also
runs alone as ``python -m verl_mopd.data``.

    python -m verl_mopd.data.fixtures /tmp/uni_gui
    verl-mopd prepare --input /tmp/uni_gui/trajectories.jsonl --out /tmp/uni_gui/out

Resuming: outputs are written atomically; ``manifest.json`` records a fingerprint of the inputs
(path, size, mtime) and of every option, and a rerun with the same fingerprint whose files all
exist does nothing (``--overwrite`` forces). Judge answers are cached per request
(``--judge-cache``), so an interrupted run resumes without asking the judge again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from dataclasses import asdict
from typing import Any

from verl_mopd.data.convert import IMAGE_MODES, ConvertConfig, convert
from verl_mopd.data.judges import SCORE_THRESHOLD, JudgeConfig, OfflineJudge, OpenAIJudge
from verl_mopd.data.readers import read_agentnet, read_android_control
from verl_mopd.data.trajectories import MAX_STEPS, RULES, CleanConfig, clean, clean_report, format_report, read_jsonl

MANIFEST = "manifest.json"


def add_prepare_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    io = parser.add_argument_group("inputs and outputs")
    io.add_argument("--input", action="append", default=[], metavar="JSONL", help="Uni-GUI schema JSONL (repeatable)")
    io.add_argument("--agentnet", action="append", default=[], metavar="JSONL", help="OpenCUA AgentNet JSONL (repeatable)")
    io.add_argument("--agentnet-images", default=None, metavar="DIR", help="AgentNet image folder (default <jsonl dir>/images)")
    io.add_argument(
        "--android-control", action="append", default=[], metavar="PATH",
        help="AndroidControl episodes: a JSONL export, or a TFRecord glob (needs tensorflow) (repeatable)",
    )  # fmt: skip
    io.add_argument("--android-control-images", default=None, metavar="DIR", help="where AndroidControl screenshots are/go")
    io.add_argument("--scroll-is-finger", action="store_true", help="AndroidControl scroll direction is the finger's")
    io.add_argument("--out", required=True, metavar="DIR", help="output folder")
    io.add_argument("--overwrite", action="store_true", help="redo even if manifest.json says the outputs are current")
    io.add_argument("--workers", type=int, default=4, help="threads for image I/O and judge requests")
    io.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")

    cl = parser.add_argument_group("cleaning")
    cl.add_argument("--skip-rule", action="append", default=[], choices=list(RULES), help="disable a rule (repeatable)")
    cl.add_argument("--max-steps", type=int, default=MAX_STEPS, help="max_steps rule limit (default %(default)s)")
    cl.add_argument(
        "--missing-verdict", choices=["error", "drop", "keep"], default="error",
        help="subtasks rule, trajectory without a verdict (default %(default)s)",
    )  # fmt: skip

    jg = parser.add_argument_group("subtask judge (offline unless --judge-base-url)")
    jg.add_argument("--judge-base-url", default=None, help="OpenAI-compatible API root, e.g. http://127.0.0.1:30000/v1")
    jg.add_argument("--judge-model", default=None, help="model name sent to the judge server")
    jg.add_argument("--judge-api-key-env", default="OPENAI_API_KEY", help="env var with the bearer token")
    jg.add_argument("--judge-cache", default=None, metavar="DIR", help="answer cache (default <out>/judge_cache)")
    jg.add_argument("--judge-max-images", type=int, default=3, help="last N screenshots sent to the judge")
    jg.add_argument("--judge-threshold", type=float, default=SCORE_THRESHOLD, help="score >= this = completed")
    jg.add_argument("--judge-again", action="store_true", help="ask the judge even where the data has a verdict")

    cv = parser.add_argument_group("conversion")
    cv.add_argument("--val-fraction", type=float, default=0.05, help="val share per platform, by trajectory")
    cv.add_argument("--seed", type=int, default=0, help="split seed")
    cv.add_argument("--image-mode", choices=list(IMAGE_MODES), default="bytes", help="images inside the parquet or paths")
    cv.add_argument("--min-pixels", type=int, default=None)
    cv.add_argument("--max-pixels", type=int, default=None)
    cv.add_argument("--max-history", type=int, default=None, help="previous actions shown in a prompt (default all)")
    return parser


def _fingerprint(args: argparse.Namespace) -> str:
    h = hashlib.sha256()
    opts = {k: v for k, v in sorted(vars(args).items()) if k not in ("overwrite", "no_progress", "workers", "func")}
    h.update(json.dumps(opts, sort_keys=True, default=str).encode())
    for path in [*args.input, *args.agentnet, *args.android_control]:
        st = os.stat(path) if os.path.exists(path) else None
        h.update(f"{os.path.abspath(path)}:{st.st_size if st else -1}:{st.st_mtime_ns if st else -1}".encode())
    return h.hexdigest()


def _read_all(args: argparse.Namespace) -> list:
    trajs = []
    for p in args.input:
        trajs += list(read_jsonl(p))
    for p in args.agentnet:
        trajs += list(read_agentnet(p, args.agentnet_images))
    for p in args.android_control:
        trajs += list(read_android_control(p, args.android_control_images, scroll_is_finger=args.scroll_is_finger))
    return trajs


def _judge(args: argparse.Namespace):
    if not args.judge_base_url:
        return OfflineJudge(args.judge_threshold)
    if not args.judge_model:
        raise SystemExit("prepare: --judge-base-url needs --judge-model")
    return OpenAIJudge(
        JudgeConfig(
            base_url=args.judge_base_url,
            model=args.judge_model,
            api_key_env=args.judge_api_key_env,
            cache_dir=args.judge_cache or os.path.join(args.out, "judge_cache"),
            max_images=args.judge_max_images,
            threshold=args.judge_threshold,
            workers=args.workers,
            reuse_verdicts=not args.judge_again,
        )
    )


def _write_json(obj: Any, path: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
    os.replace(tmp, path)


def run_prepare(args: argparse.Namespace) -> int:
    if not (args.input or args.agentnet or args.android_control):
        raise SystemExit("prepare: give at least one of --input, --agentnet, --android-control")
    os.makedirs(args.out, exist_ok=True)
    fingerprint = _fingerprint(args)
    manifest_path = os.path.join(args.out, MANIFEST)
    if not args.overwrite and os.path.isfile(manifest_path):
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
        if manifest.get("fingerprint") == fingerprint and all(
            os.path.isfile(os.path.join(args.out, rel)) for rel in manifest.get("files", {})
        ):
            print(f"prepare: outputs in {args.out} are up to date (manifest fingerprint matches); --overwrite to redo")
            return 0
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
    trajectories = _read_all(args)
    judge = _judge(args)
    kept, drops = clean(trajectories, clean_cfg, judge=judge, progress=progress)
    report = clean_report(trajectories, kept, drops, clean_cfg)
    if isinstance(judge, OpenAIJudge):
        report["judge"] = {"model": judge.config.model, **judge.stats}

    from verl_mopd.data.trajectories import write_jsonl

    write_jsonl(kept, os.path.join(args.out, "cleaned.jsonl"))
    with open(os.path.join(args.out, "dropped.jsonl.tmp"), "w", encoding="utf-8") as f:
        for d in drops:
            f.write(json.dumps(asdict(d), ensure_ascii=False) + "\n")
    os.replace(os.path.join(args.out, "dropped.jsonl.tmp"), os.path.join(args.out, "dropped.jsonl"))
    result = convert(kept, args.out, conv_cfg, progress=progress)
    report["outputs"] = result
    _write_json(report, os.path.join(args.out, "report.json"))
    print(format_report(report))
    for rel, n in result["files"].items():
        print(f"{rel}: {n} rows")
    files = {**result["files"], "cleaned.jsonl": len(kept), "dropped.jsonl": len(drops), "report.json": 1}
    _write_json({"fingerprint": fingerprint, "files": files}, manifest_path)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = add_prepare_arguments(
        argparse.ArgumentParser(prog="verl-mopd prepare", description=__doc__.split("\n")[0])
    )
    return run_prepare(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

"""``verl-mopd eval``: offline step-level evaluation and checkpoint merges.

``verl_mopd/cli.py`` mounts this with :func:`add_eval_arguments` + :func:`run_eval`.

    verl-mopd eval offline --data test.parquet --base-url http://127.0.0.1:30000/v1 --model student \\
        --out runs/student [--max-in-flight 32] [--mode strict] [--preset aitw] [--limit 500]
    verl-mopd eval offline --data test.parquet --hf-model ckpt/ --out runs/student-hf
    verl-mopd eval merge --method ties --base base/ --models desktop/ mobile/ --density 0.5 --out merged/
    verl-mopd eval merge --method average --models desktop/ mobile/ --out averaged/

``offline`` writes ``OUT/results.jsonl`` (one scored line per sample; rerun the same command to
resume: another model, sampling or reward setting is refused), ``OUT/run.json`` and
``OUT/report.json`` (per-platform metrics) and prints the table. The online adapters
(:mod:`verl_mopd.eval.osworld`, :mod:`verl_mopd.eval.mobileworld`) are imported by the harnesses.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from verl_mopd.errors import ConfigError, UsageError
from verl_mopd.files import refuse_overwrite
from verl_mopd.rewards.score import MODES, PRESETS, make_configs


def _add_offline(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="verl parquet of step prompts (file or folder)")
    p.add_argument("--out", required=True, help="output folder: results.jsonl (resumable) + report.json")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:30000/v1")
    src.add_argument("--hf-model", help="local transformers checkpoint folder instead of a server")
    p.add_argument("--model", help="served model name (with --base-url)")
    p.add_argument("--api-key", default=None, help="bearer token for the endpoint, if it needs one")
    p.add_argument("--max-in-flight", type=int, default=16, help="concurrent requests (HTTP client)")
    p.add_argument("--max-tokens", type=int, default=2048, help="generation budget per step")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy, as the papers evaluate")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per HTTP request")
    p.add_argument("--max-retries", type=int, default=5, help="retries per request (backoff 1, 2, 4, ... s)")
    p.add_argument("--device", default="cpu", help="--hf-model: torch device")
    p.add_argument("--dtype", default="float32", help="--hf-model: torch dtype")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N samples")
    p.add_argument("--platform", action="append", choices=["desktop", "mobile"], help="only these platforms")
    p.add_argument("--mode", choices=list(MODES), default="strict", help="reward mode (as in training)")
    p.add_argument("--preset", choices=list(PRESETS), default=None, help="strict-mode tolerance preset")
    p.add_argument("--reward-kwargs", default=None, help="JSON object of extra reward kwargs (strict mode)")
    p.add_argument("--image-root", default=None,
                   help="folder image paths in the data are resolved against and confined to (default: the data's folder)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_merge(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", choices=["average", "ties"], required=True,
                   help="average: weighted mean of the weights; ties: TIES merging of the task vectors against --base")
    p.add_argument("--models", nargs="+", required=True, help="checkpoint folders (safetensors)")
    p.add_argument("--base", default=None, help="common base checkpoint (ties)")
    p.add_argument("--weights", type=float, nargs="+", default=None, help="one per model")
    p.add_argument("--density", type=float, default=0.5, help="ties: fraction of each task vector kept")
    p.add_argument("--scale", type=float, default=1.0, help="ties: lambda on the merged task vector")
    p.add_argument("--majority-sign-method", choices=["total", "frequency"], default="total",
                   help="ties: elect each weight's sign from the sum of the task vectors (total, the paper's) or from "
                        "the number of models of each sign (frequency) (default: %(default)s)")
    p.add_argument("--compute-dtype", choices=["float32", "float64"], default="float32",
                   help="dtype the merge is computed in; the output keeps each tensor's dtype (default: %(default)s)")
    p.add_argument("--out", required=True, help="output checkpoint folder")


def add_eval_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    sub = parser.add_subparsers(dest="eval_command", required=True)
    _add_offline(sub.add_parser("offline", help="step-level metrics on a verl parquet"))
    _add_merge(sub.add_parser("merge", help="weight-average or TIES merge of checkpoints"))
    return parser


def _offline(args: argparse.Namespace) -> int:
    from verl_mopd.clients import OpenAIClient, RetryPolicy, TransformersClient
    from verl_mopd.eval.offline import evaluate, format_table, load_samples

    try:
        reward_kwargs = json.loads(args.reward_kwargs) if args.reward_kwargs else {}
    except json.JSONDecodeError as e:
        raise UsageError(f"--reward-kwargs: not JSON ({e.msg} at column {e.colno}): {args.reward_kwargs[:80]!r}") from None
    if not isinstance(reward_kwargs, dict):
        raise UsageError(f"--reward-kwargs={args.reward_kwargs!r}: must be a JSON object")
    if args.preset:
        reward_kwargs["preset"] = args.preset
    if args.mode == "ui_mopd" and reward_kwargs:
        raise UsageError(f"--mode ui_mopd reproduces the release and takes no --preset/--reward-kwargs; got {sorted(reward_kwargs)}")
    try:
        make_configs(**reward_kwargs)
    except (ValueError, TypeError) as e:
        raise UsageError(f"--reward-kwargs: {'; '.join(e.errors) if isinstance(e, ConfigError) else e}") from None
    for option, value in (("--max-in-flight", args.max_in_flight), ("--max-tokens", args.max_tokens)):
        if value < 1:
            raise UsageError(f"{option}={value}: must be >= 1")
    if args.max_retries < 0:
        raise UsageError(f"--max-retries={args.max_retries}: must be >= 0")
    if args.image_root is not None and not os.path.isdir(args.image_root):
        raise UsageError(f"--image-root={args.image_root}: not a folder")
    refuse_overwrite(args.out, [args.data], "--out")
    if args.hf_model and not os.path.isdir(args.hf_model):
        raise UsageError(f"--hf-model={args.hf_model}: not a checkpoint folder")
    samples = load_samples(args.data, limit=args.limit, platforms=args.platform, image_root=args.image_root)
    sampling = {"max_tokens": args.max_tokens, "temperature": args.temperature}
    if args.base_url:
        if not args.model:
            raise UsageError("--base-url needs --model (the served model name)")
        client = OpenAIClient(
            args.base_url,
            args.model,
            api_key=args.api_key,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            timeout=args.timeout,
            retry=RetryPolicy(max_retries=args.max_retries),
        )
        in_flight, source = args.max_in_flight, {"base_url": args.base_url.rstrip("/"), "model": args.model}
    else:
        client = TransformersClient(
            args.hf_model, max_new_tokens=args.max_tokens, temperature=args.temperature, device=args.device, dtype=args.dtype
        )
        in_flight, source = 1, {"hf_model": os.path.abspath(args.hf_model), "dtype": args.dtype}
    report = evaluate(
        samples,
        client.complete,
        args.out,
        max_in_flight=in_flight,
        mode=args.mode,
        reward_kwargs=reward_kwargs,
        progress=not args.no_progress,
        meta={"data": args.data, **source},
        run={**source, **sampling},
    )
    if isinstance(client, TransformersClient) and client.images_dropped:
        print(f"note: text-only model; {client.images_dropped} images were dropped from the prompts", file=sys.stderr)
    print(format_table(report["metrics"]))
    c = report["counts"]
    print(f"scored {c['scored']}/{c['samples']} (resumed {c['resumed']}, failed {c['failed']}); report: {args.out}/report.json")
    return 0 if c["failed"] == 0 else 1


def _merge(args: argparse.Namespace) -> int:
    from verl_mopd.eval.merge import MergeConfig, merge_checkpoints

    cfg = MergeConfig(
        method=args.method,
        models=tuple(args.models),
        base=args.base,
        weights=tuple(args.weights) if args.weights else None,
        density=args.density,
        scale=args.scale,
        majority_sign_method=args.majority_sign_method,
        compute_dtype=args.compute_dtype,
    )
    counts = merge_checkpoints(cfg, args.out)
    print(json.dumps({"out": args.out, **counts}))
    return 0


def run_eval(args: argparse.Namespace) -> int:
    return {"offline": _offline, "merge": _merge}[args.eval_command](args)

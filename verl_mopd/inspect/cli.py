"""``verl-mopd inspect DIR [--out FILE] [--tokenizer PATH]``: a run's dumps as one static HTML page.

DIR holds the step dumps of the ``mopd_*`` trainers (``VERL_MOPD_STEP_DUMP``, ``step_<N>.pt``) or
verl's rollout dumps (``trainer.rollout_data_dir``, ``<step>.jsonl``), or a folder above exactly
one such folder (a smoke's output folder). The page: per platform, the responses with each token
shaded by its K3, the tokens with the largest K3, the gate's on-fraction and K3 over steps, and the
teacher against student log-prob scatter (docs/inspect.md).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from verl_mopd.errors import UsageError

__all__ = ["add_inspect_arguments", "run_inspect"]


def add_inspect_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("dir", metavar="DIR",
                        help="folder of step_<N>.pt (VERL_MOPD_STEP_DUMP) or <step>.jsonl (verl's "
                             "trainer.rollout_data_dir) dumps, or a folder above exactly one such folder")
    parser.add_argument("--out", default="mopd_inspect.html",
                        help="the HTML file to write (default: mopd_inspect.html); an existing file is replaced "
                             "only if it is an earlier report")
    parser.add_argument("--tokenizer", default="",
                        help="the student's tokenizer (a local folder, e.g. actor_rollout_ref.model.path) to show "
                             "step dumps' tokens as text; without it tokens show as <id>")
    parser.add_argument("--routing-key", default="platform",
                        help="verl rollout dumps: the field (of the record, else of its ground truth) naming each "
                             "sample's platform, as mopd.routing_key (default: platform)")
    parser.add_argument("--top", type=int, default=20, help="tokens with the largest K3 listed per platform")
    parser.add_argument("--samples", type=int, default=4,
                        help="responses shown per platform (those with the largest mean K3)")
    parser.add_argument("--max-points", type=int, default=3000,
                        help="scatter points per platform at most (spread evenly over the K3 order)")
    return parser


def _decoder(path: str):
    if not path:
        return None
    if not os.path.isdir(path):
        raise UsageError(f"--tokenizer={path}: no such folder (give the student model's local folder)")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--tokenizer={path}: not a tokenizer folder ({str(exc).splitlines()[0]})") from exc
    return lambda token_id: tokenizer.decode([token_id])


def check_out(out: str) -> Path:
    """``--out``: a new file, or an earlier report (replaced); anything else is refused, naming ``--out``."""
    from verl_mopd.inspect.page import MARKER

    path = Path(out)
    if path.is_dir():
        raise UsageError(f"--out={out}: is a folder; give the HTML file to write, e.g. {path / 'mopd_inspect.html'}")
    if path.exists():
        with open(path, "rb") as f:
            head = f.read(len(MARKER)).decode("utf-8", "replace")
        if head != MARKER:
            raise UsageError(f"--out={out}: exists and is not a verl-mopd inspect report; not replacing it: "
                             "give another --out")
    if not path.parent.is_dir():
        raise UsageError(f"--out={out}: no folder {path.parent}")
    return path


def run_inspect(args: argparse.Namespace) -> int:
    from verl_mopd.files import atomic_write
    from verl_mopd.inspect.dumps import read_dumps
    from verl_mopd.inspect.page import render
    from verl_mopd.inspect.report import build_report

    out = check_out(args.out)  # before any reading
    for name in ("top", "samples", "max_points"):
        value, low = getattr(args, name), {"top": 1, "samples": 0, "max_points": 2}[name]
        if value < low:
            raise UsageError(f"--{name.replace('_', '-')}={value}: must be >= {low}")
    decode = _decoder(args.tokenizer)
    dumps = read_dumps(args.dir, routing_key=args.routing_key)
    if not dumps.samples:
        raise UsageError(f"DIR={args.dir}: {len(dumps.files)} dump file(s) in {dumps.folder}, but no samples "
                         f"({dumps.padding_rows} padding rows)")
    report = build_report(dumps.samples, decode, top=args.top, samples_shown=args.samples, max_points=args.max_points)
    steps = sorted({s.step for s in dumps.samples})
    what = ("step dumps (VERL_MOPD_STEP_DUMP)" if dumps.kind == "step"
            else "verl rollout dumps (trainer.rollout_data_dir)")
    source = [f"{len(dumps.files)} {what} in {dumps.folder}: steps {steps[0]}-{steps[-1]}, {len(dumps.samples)} samples"
              + (f" ({dumps.padding_rows} padding rows left out)" if dumps.padding_rows else "")
              + ("" if decode or dumps.kind != "step" else "; tokens as <id> (give --tokenizer to decode them)")]
    with atomic_write(out) as f:
        title = f"verl-mopd inspect: {'/'.join(dumps.folder.resolve().parts[-2:])}"
        f.write(render(report, title=title, source=source))
    per = "; ".join(f"{r.platform}: {r.n_samples} samples, K3 mean {'-' if r.k3_mean is None else f'{r.k3_mean:.4f}'}"
                    for r in report.platforms)
    print(f"{source[0]}\n{per}\nwrote {out}")
    return 0

"""Re-measure the CPU demo and write its numbers into README.md and docs/demo.md (a check, not a timed test).

    python scripts/demo_readme.py table [--out DIR]   # `verl-mopd demo` at its defaults (3 seeds), cold
    python scripts/demo_readme.py sweep [--out DIR]   # MOPD at beta 0.01 / 0.1 / 0.3 / 0.5 / 1.0, 3 seeds each
    python scripts/demo_readme.py seeds [--out DIR]   # the defaults on 9 more seeds (3-11), per seed
    python scripts/demo_readme.py bases [--out DIR]   # the defaults from base seed 1's bases
    python scripts/demo_readme.py beta-seeds [--out DIR]  # seeds 3-11 at the default beta and at 0.5, paired

``table`` runs ``verl-mopd demo`` (as ``python -m verl_mopd.cli demo``) in a child process from a fresh folder (so the bases are
pretrained, as on a first run) and records its table, the paired differences, the gradient-norm
ratio, and the wall and CPU time of the whole process tree; it copies the run's ``demo.png`` to
``docs/demo.png``. ``sweep`` runs the stage-1/2 part per beta from shared bases and records
MOPD's accuracy, ``beta*|grad K3| / |grad PG|``, K3 and the KL-on fraction. Each writes the blocks
between its ``<!-- demo-...:start/end -->`` markers (``--no-write`` only prints and copies nothing):
``table`` the README's ``demo-summary`` (the measured line, the table, the plot) and docs/demo.md's
``demo-table`` (everything); ``sweep`` docs/demo.md's ``demo-sweep``; ``seeds`` (one run of the
defaults on seeds 3-11, beside the table's 0-2) docs/demo.md's ``demo-seeds`` (per seed, the
9-seed paired differences, every window of 3 consecutive seeds, the mixed-SFT seesaw) and the README's ``demo-seeds``
(its verdict); ``bases`` docs/demo.md's ``demo-bases`` (the defaults from base seed 1's bases, which
stop at the default validation acc: where they stop, and the verdict from them); ``beta-seeds``
docs/demo.md's ``demo-beta-seeds`` (the seeds of ``seeds`` at the default beta and at ``BETA_CHECK``,
both runs on this machine from the same bases: MOPD per seed, paired, and the windows at
``BETA_CHECK`` against the default run's baselines, which do not depend on beta). ``seeds``,
``bases`` and ``beta-seeds`` read back a complete run with the same config from ``--out`` instead of
running it again. Timings depend on the machine's load; the block says how many cores
the machine has and its load average when the run started.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from verl_mopd.demo.config import PLATFORMS

ROOT = Path(__file__).resolve().parent.parent
BETAS = (0.01, 0.1, 0.3, 0.5, 1.0)
#: ``seeds``: the first seed and how many (the table runs seeds 0-2)
SEEDS = (3, 9)
#: ``bases``: the other base seeds (the table's is 0)
BASE_SEEDS = (1,)
#: ``seeds``: the verdict is judged on every window of this many consecutive seeds
WINDOW = 3
#: ``beta-seeds``: the beta set against the default on the seeds ``SEEDS`` (the sweep's runner-up)
BETA_CHECK = 0.5
#: where ``table`` puts the run's demo.png (the README shows it under the table)
PLOT = "docs/demo.png"


def replace_block(text: str, name: str, body: str) -> str:
    """``text`` with the lines between ``<!-- {name}:start -->`` and ``<!-- {name}:end -->`` replaced."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"the document needs exactly one {start} ... {end} block")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}\n{body.rstrip()}\n{end}{tail}"


def _machine() -> str:
    return f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start"


def table(out: Path) -> dict[str, str]:
    """``{block name: body}`` of one cold ``verl-mopd demo`` run."""
    from verl_mopd.demo.report import comparison_table, difference_table

    shutil.rmtree(out, ignore_errors=True)
    machine = _machine()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    env = os.environ | {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run([sys.executable, "-m", "verl_mopd.cli", "demo", f"--out={out}"], check=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    s = json.loads((out / "summary.json").read_text())
    g, cfg = s["grad_ratio"], s["config"]
    measured = (f"Measured by `python scripts/demo_readme.py table`: `verl-mopd demo` at its defaults "
                f"({cfg['seeds']} seeds, {cfg['eval_tasks']} held-out tasks per platform, greedy), **{wall:.0f} s "
                f"wall, {cpu:.0f} s CPU** for the whole process tree ({machine}). Mean ± standard error over seeds:")
    plot = "![demo.png of this run: per-platform rollout reward of MOPD and GRPO, K3, gradient-norm ratio]({})"
    full = "\n".join([
        measured, "", comparison_table(s["aggregate"]), "",
        "Paired per seed (MOPD − X on the same tasks; *above*/*below*: more than 2 standard errors from 0):",
        "", difference_table(s["aggregate"]), "",
        f"beta = {cfg['beta']}: `beta*|grad K3| / |grad PG|` median {g['median']:.2f} (10-90%: {g['q10']:.2f}-"
        f"{g['q90']:.2f}) over {g['steps']} MOPD steps with reward variance.",
        "", plot.format("demo.png"),
    ])
    summary = "\n".join([measured, "", comparison_table(s["aggregate"]), "", plot.format(PLOT)])
    return {"README.md:demo-summary": summary, "docs/demo.md:demo-table": full}


def _window(records, key, first: bool, n: int = 10) -> float:
    vals = []
    for seed in sorted({r["seed"] for r in records}):
        rs = [r[key] for r in records if r["seed"] == seed]
        vals += [v for v in (rs[:n] if first else rs[-n:]) if v == v]
    return float(np.mean(vals)) if vals else float("nan")


def sweep(out: Path) -> str:
    from verl_mopd.demo.run import DemoConfig, run

    machine = _machine()
    rows = ["| beta | MOPD desktop acc | MOPD mobile acc | beta·‖∇K3‖/‖∇PG‖ median (10-90%) | "
            "K3 desktop, first → last 10 steps | K3 mobile | KL-on fraction |", "|---|---|---|---|---|---|---|"]
    for beta in BETAS:
        cfg = DemoConfig(beta=beta, baselines=False, plot=False, out=str(out / f"beta{beta}"), bases=str(out / "bases"))
        s = run(cfg)
        recs = [r for r in s["records"] if r["run"] == "mopd"]
        t, g = s["aggregate"]["table"]["MOPD student"], s["grad_ratio"]
        rows.append(
            f"| {beta} | {t['desktop']['acc'][0]:.3f} ± {t['desktop']['acc'][1]:.3f} | "
            f"{t['mobile']['acc'][0]:.3f} ± {t['mobile']['acc'][1]:.3f} | "
            f"{g['median']:.2f} ({g['q10']:.2f}-{g['q90']:.2f}) | "
            + " | ".join(f"{_window(recs, f'k3/{p}', True):.3f} → {_window(recs, f'k3/{p}', False):.3f}"
                         for p in PLATFORMS)
            + f" | {_window(recs, 'mask_on_fraction', True):.2f} → {_window(recs, 'mask_on_fraction', False):.2f} |")
    cfg = DemoConfig()
    return "\n".join([
        f"Measured by `python scripts/demo_readme.py sweep` ({cfg.seeds} seeds per beta, everything else at the "
        f"defaults, {machine}). Mean ± standard error over seeds:", "", *rows])


def _run(cfg) -> tuple[dict, float]:
    """``(summary, wall s)`` of ``verl_mopd.demo.run(cfg)``; a complete run already in ``cfg.out`` with the
    same config is read back instead (so a failed write-up does not cost the run again)."""
    from dataclasses import asdict

    from verl_mopd.demo.run import run

    done = Path(cfg.out) / "summary.json"
    if done.exists() and (s := json.loads(done.read_text()))["config"] == json.loads(json.dumps(asdict(cfg))):
        print(f"reusing the complete run in {cfg.out}")
        return s, s["wall_s"]
    t0 = time.perf_counter()
    s = run(cfg)
    return s, time.perf_counter() - t0


def _verdict(wins: list[dict], n: int, who: str = "MOPD is") -> str:
    from verl_mopd.demo.report import VERDICT

    held = sum(w["holds"] for w in wins)
    names = ", ".join(f"*{m}*" for m in VERDICT[:-1]) + f" and *{VERDICT[-1]}*"
    text = (f"{who} above {names} on both platforms by more than 2 paired standard errors in **{held} of "
            f"{len(wins)}** {'window' if len(wins) == 1 else 'windows'} of {n} consecutive seeds")
    if held == len(wins):
        return text + "."
    return text + "; not in " + "; ".join(
        f"seeds {w['seeds'][0]}-{w['seeds'][-1]} ({', '.join(w['failed'])})" for w in wins if not w["holds"]) + "."


def seeds(out: Path) -> dict[str, str]:
    """``{block name: body}`` of one run of the defaults on the seeds ``SEEDS`` (base seed fixed)."""
    from verl_mopd.demo.report import aggregate, difference_table, per_seed_table, seesaw, windows
    from verl_mopd.demo.run import DemoConfig

    machine = _machine()
    first, n = SEEDS
    s, wall = _run(DemoConfig(seed=first, seeds=n, plot=False, out=str(out), bases=str(out / "bases")))
    verdict = _verdict(windows(s["per_seed"], n=WINDOW), WINDOW)
    measured = (f"Measured by `python scripts/demo_readme.py seeds`: one run of `verl-mopd demo --seed {first} --seeds {n}` "
                f"(the defaults and bases of the table, seeds {first}-{first + n - 1}, {wall:.0f} s wall, {machine}).")
    full = "\n".join([
        measured, "", "Per seed (MOPD's greedy acc, and MOPD acc minus each baseline's, desktop / mobile):", "",
        per_seed_table(s["per_seed"]), "", f"Paired over the {n} seeds:", "", difference_table(aggregate(s["per_seed"])),
        "", verdict, "", seesaw(s["per_seed"])])
    short = (f"On {n} more seeds ({first}-{first + n - 1}, one run of `python scripts/demo_readme.py seeds`; per seed in "
             f"[docs/demo.md](docs/demo.md#the-verdict-on-more-seeds)): {verdict}")
    return {"docs/demo.md:demo-seeds": full, "README.md:demo-seeds": short}


def _stopped_at(base: Path) -> int:
    """The pretraining step where the base in ``base`` stopped (its ``pretrain.json``)."""
    return json.loads((base / "pretrain.json").read_text())["stopped_at"]


def bases(out: Path) -> str:
    """The demo at its defaults (seeds 0-2) from the bases of other base seeds (``BASE_SEEDS``), which
    stop at the same validation acc as base seed 0's (the default targets), at another step."""
    from verl_mopd.demo.report import aggregate, windows
    from verl_mopd.demo.run import DemoConfig
    from verl_mopd.demo.stages import pretrain_base

    machine = _machine()
    default = DemoConfig()
    stops = {0: {r: _stopped_at(Path(pretrain_base(DemoConfig(out=str(out / "base0")), r)))
                 for r in ("student", "teacher")}}
    rows = ["| base seed | student base: steps, acc (desktop / mobile) | teacher base: steps, acc | MOPD acc | "
            "MOPD − GRPO, no KL | MOPD − weight average | MOPD − TIES | verdict |", "|---" * 8 + "|"]
    walls = []
    for b in BASE_SEEDS:
        s, wall = _run(DemoConfig(base_seed=b, plot=False, out=str(out / f"base{b}")))
        walls.append(f"{wall:.0f}")
        stops[b] = {r: _stopped_at(out / f"base{b}" / "bases" / r) for r in ("student", "teacher")}
        agg = aggregate(s["per_seed"])
        acc = {m: " / ".join(f"{agg['table'][m][p]['acc'][0]:.3f}" for p in PLATFORMS)
               for m in ("student base", "teacher base", "MOPD student")}
        diff = {m: " / ".join(f"{d[p]['mean']:+.3f} ± {d[p]['se']:.3f}" for p in PLATFORMS)
                for m, d in agg["diffs"].items()}
        w = windows(s["per_seed"])[0]
        verdict = "holds" if w["holds"] else "not: " + ", ".join(w["failed"])
        rows.append(f"| {b} | {stops[b]['student']}, {acc['student base']} | {stops[b]['teacher']}, "
                    f"{acc['teacher base']} | {acc['MOPD student']} | {diff['GRPO, no KL']} | "
                    f"{diff['weight average']} | {diff['TIES']} | {verdict} |")
    head = (f"Measured by `python scripts/demo_readme.py bases`: `verl-mopd demo --base-seed B` (seeds 0-2, every "
            f"other knob at its default; {', '.join(walls)} s wall, {machine}). Its bases stop at the default "
            f"targets, validation acc {default.base_acc} (student) and {default.teacher_base_acc} (teacher), checked "
            f"every {default.base_check_every} steps; base seed 0's stop at steps {stops[0]['student']} and "
            f"{stops[0]['teacher']}. Mean over the 3 seeds; the differences are paired, ± their standard error; "
            "*holds*: MOPD above *GRPO, no KL*, *weight average* and *TIES* on both platforms by more than 2 "
            "paired standard errors:")
    return "\n".join([head, "", *rows])


def beta_seeds(out: Path) -> str:
    """The body of ``demo-beta-seeds``: the defaults on the seeds ``SEEDS`` (with the baselines) and MOPD
    alone at ``BETA_CHECK`` (same seeds, bases and prompts), both run here."""
    from verl_mopd.demo.run import DemoConfig

    machine, beta = _machine(), DemoConfig().beta
    first, n = SEEDS
    common = dict(seed=first, seeds=n, plot=False, bases=str(out / "bases"))
    default, wall = _run(DemoConfig(**common, out=str(out / "default")))
    other, wall_b = _run(DemoConfig(**common, beta=BETA_CHECK, baselines=False, out=str(out / f"beta{BETA_CHECK}")))
    head = (f"Measured by `python scripts/demo_readme.py beta-seeds`: `verl-mopd demo --seed {first} --seeds {n}` at the "
            f"default beta {beta} and with `--beta {BETA_CHECK}` (seeds {first}-{first + n - 1}, both on "
            f"this machine from the same bases; {wall:.0f} s and {wall_b:.0f} s wall, {machine}).")
    return "\n".join([head, "", beta_block(default["per_seed"], other["per_seed"], beta, BETA_CHECK)])


def beta_block(default: list[dict], other: list[dict], beta: float, beta_other: float) -> str:
    """MOPD's acc per seed at ``beta`` (``default``: runs with the baselines) and at ``beta_other``
    (``other``: MOPD only, the same seeds in the same order), the paired difference, and the windows
    of ``WINDOW`` seeds at ``beta_other`` against ``default``'s baselines (they do not depend on beta)."""
    from verl_mopd.demo.report import paired, windows

    if [s["seed"] for s in default] != [s["seed"] for s in other]:
        raise ValueError(f"the two runs have other seeds: {[s['seed'] for s in default]} vs "
                         f"{[s['seed'] for s in other]}")
    name = f"MOPD, beta {beta_other}"
    both = [{"seed": a["seed"], "eval": {**a["eval"], name: b["eval"]["MOPD student"]}} for a, b in zip(default, other)]
    rows = [f"| seed | MOPD acc, beta {beta} | beta {beta_other} | difference |", "|---|---|---|---|"]
    for s in both:
        e = s["eval"]
        rows.append(f"| {s['seed']} | " + " | ".join(" / ".join(f"{e[m][p]['acc']:.3f}" for p in PLATFORMS)
                                                    for m in ("MOPD student", name))
                    + " | " + " / ".join(f"{e[name][p]['acc'] - e['MOPD student'][p]['acc']:+.3f}" for p in PLATFORMS)
                    + " |")
    diffs = {p: paired(both, name, "MOPD student", p) for p in PLATFORMS}
    ahead = {p: sum(s["eval"][name][p]["acc"] > s["eval"]["MOPD student"][p]["acc"] for s in both) for p in PLATFORMS}
    line = (f"beta {beta_other} minus beta {beta}, paired over {len(both)} seeds: " + "; ".join(
        f"{p} {d['mean']:+.3f} ± {d['se']:.3f} ({d['verdict']}; ahead on {ahead[p]} of {len(both)})"
        for p, d in diffs.items()) + ".")
    swapped = [{"seed": s["seed"], "eval": {**s["eval"], "MOPD student": s["eval"][name]}} for s in both]
    verdict = _verdict(windows(swapped, n=WINDOW), WINDOW, who=f"At beta {beta_other} MOPD is")
    return "\n".join([*rows, "", line, "", verdict])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["table", "sweep", "seeds", "bases", "beta-seeds"])
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: TMPDIR/verl-mopd-demo-<what>)")
    parser.add_argument("--no-write", action="store_true", help="print the blocks, leave the documents alone")
    args = parser.parse_args(argv)
    out = (args.out or Path(tempfile.gettempdir()) / f"verl-mopd-demo-{args.what}").resolve()
    blocks = (table(out) if args.what == "table" else seeds(out) if args.what == "seeds"
              else {"docs/demo.md:demo-bases": bases(out)} if args.what == "bases"
              else {"docs/demo.md:demo-beta-seeds": beta_seeds(out)} if args.what == "beta-seeds"
              else {"docs/demo.md:demo-sweep": sweep(out)})
    for where, body in blocks.items():
        print(f"--- {where}\n{body}")
    if not args.no_write:
        for where, body in blocks.items():
            doc, _, name = where.partition(":")
            path = ROOT / doc
            path.write_text(replace_block(path.read_text(), name, body))
            print(f"wrote the {name} block of {path}")
        if args.what == "table":
            shutil.copyfile(out / "demo.png", ROOT / PLOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())

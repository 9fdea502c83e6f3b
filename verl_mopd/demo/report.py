"""The demo's report: mean ± standard error over seeds, the paired differences, the tables and the plot."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np

from verl_mopd.demo.config import BASELINES, MODELS, PLATFORMS, _plural


def _mean_se(v: list[float]) -> tuple[float, float]:
    a = np.asarray(v, dtype=float)
    return float(a.mean()), float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else float("nan")


def aggregate(per_seed: list[dict]) -> dict:
    """Mean and standard error over seeds, per model and platform, of ``acc`` and ``reward``; and
    the paired differences MOPD - X per seed (``{"mean", "se", "verdict"}``: ``above`` / ``below``
    when the mean is more than 2 standard errors from 0, else ``tie``)."""
    models = [m for m in MODELS if all(m in s["eval"] for s in per_seed)]
    table = {m: {p: {k: _mean_se([s["eval"][m][p][k] for s in per_seed]) for k in ("acc", "reward")}
                 for p in PLATFORMS} for m in models}
    diffs = {m: {p: paired(per_seed, "MOPD student", m, p) for p in PLATFORMS} for m in BASELINES if m in models}
    return {"table": table, "diffs": diffs, "n_seeds": len(per_seed)}


def paired(per_seed: list[dict], a: str, b: str, platform: str) -> dict:
    """``a``'s acc minus ``b``'s on ``platform``, paired per seed: ``{"mean", "se", "verdict"}``."""
    mean, se = _mean_se([s["eval"][a][platform]["acc"] - s["eval"][b][platform]["acc"] for s in per_seed])
    verdict = ("above" if mean > 2 * se else "below" if mean < -2 * se else "tie") if se == se else "n/a"
    if se == 0:
        verdict = "above" if mean > 0 else "below" if mean < 0 else "tie"
    return {"mean": mean, "se": se, "verdict": verdict}


def seesaw(per_seed: list[dict]) -> str:
    """The mixed-SFT seesaw as measured: mixed SFT's acc minus each single-platform SFT's and each
    teacher's on that model's own platform, paired per seed (the seesaw: below all four)."""
    cells = [f"{m} on {p} {_pm(((d := paired(per_seed, 'mixed SFT', m, p))['mean'], d['se']), '+.3f')} "
             f"({d['verdict']})" for p in PLATFORMS for m in (f"{p} SFT", f"teacher:{p}")]
    return f"Mixed SFT minus, paired over {_plural(len(per_seed), 'seed')}: " + "; ".join(cells) + "."


def _pm(ms: tuple[float, float], spec: str) -> str:
    m, s = ms
    return f"{m:{spec}} ± {s:.3f}" if s == s else f"{m:{spec}}"


def comparison_table(agg: dict) -> str:
    """Greedy eval per platform, mean ± standard error over seeds (acc = fully correct fraction,
    reward in [-1, 1]), markdown."""
    lines = [f"| model ({_plural(agg['n_seeds'], 'seed')}) | desktop acc | mobile acc | desktop reward | mobile reward |",
             "|---|---|---|---|---|"]
    for name, e in agg["table"].items():
        lines.append(f"| {name} | " + " | ".join([_pm(e[p]["acc"], ".3f") for p in PLATFORMS]
                                                 + [_pm(e[p]["reward"], "+.3f") for p in PLATFORMS]) + " |")
    return "\n".join(lines)


def difference_table(agg: dict) -> str:
    """MOPD acc - baseline acc, paired per seed: mean ± standard error, and the verdict."""
    lines = ["| MOPD acc minus | desktop | mobile |", "|---|---|---|"]
    for name, d in agg["diffs"].items():
        lines.append(f"| {name} | " + " | ".join(
            f"{_pm((d[p]['mean'], d[p]['se']), '+.3f')} ({d[p]['verdict']})" for p in PLATFORMS) + " |")
    return "\n".join(lines)


#: the comparisons the demo's verdict rests on: MOPD above each of them on both platforms
VERDICT = ("GRPO, no KL", "weight average", "TIES")


def per_seed_table(per_seed: list[dict], against: tuple[str, ...] = (*VERDICT, "mixed SFT")) -> str:
    """One row per seed: MOPD's acc, and MOPD acc - X for each X in ``against``, each cell
    ``desktop / mobile``, markdown."""
    lines = ["| seed | MOPD acc | " + " | ".join(f"MOPD − {m}" for m in against) + " |",
             "|---" * (len(against) + 2) + "|"]
    for s in per_seed:
        e = s["eval"]
        mopd = e["MOPD student"]
        lines.append(f"| {s['seed']} | " + " / ".join(f"{mopd[p]['acc']:.3f}" for p in PLATFORMS) + " | " + " | ".join(
            " / ".join(f"{mopd[p]['acc'] - e[m][p]['acc']:+.3f}" for p in PLATFORMS) for m in against) + " |")
    return "\n".join(lines)


def windows(per_seed: list[dict], against: tuple[str, ...] = VERDICT, n: int = 3) -> list[dict]:
    """Every run of ``n`` consecutive seeds of ``per_seed`` (in its order): ``{"seeds", "holds", "failed"}``,
    where ``holds`` says MOPD is above every model of ``against`` on both platforms by more than 2
    paired standard errors over those seeds, and ``failed`` lists the comparisons that are not
    (``"TIES mobile +0.023 ± 0.014 (tie)"``)."""
    if n < 2:
        raise ValueError(f"n={n}: a paired standard error needs at least 2 seeds")
    out = []
    for i in range(len(per_seed) - n + 1):
        diffs = aggregate(per_seed[i:i + n])["diffs"]
        failed = [f"{m} {p} {_pm((d['mean'], d['se']), '+.3f')} ({d['verdict']})"
                  for m in against for p in PLATFORMS if (d := diffs[m][p])["verdict"] != "above"]
        out.append({"seeds": [s["seed"] for s in per_seed[i:i + n]], "holds": not failed, "failed": failed})
    return out


def _plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    runs = list(dict.fromkeys(r["run"] for r in records))

    def curve(run, key):
        seeds = sorted({r["seed"] for r in records if r["run"] == run})
        rows = np.array([[r[key] for r in records if r["run"] == run and r["seed"] == s] for s in seeds], dtype=float)
        rows = np.array([_smooth(list(row)) for row in rows])
        steps = np.arange(1, rows.shape[1] + 1)
        with warnings.catch_warnings():  # all-nan columns (steps without reward variance) plot as gaps
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(rows, 0)
            se = np.nanstd(rows, 0, ddof=1) / math.sqrt(len(rows)) if len(rows) > 1 else np.zeros_like(mean)
        return steps, mean, se

    for ax, p in zip(axes[:2], PLATFORMS, strict=True):
        for run in runs:
            steps, mean, se = curve(run, f"reward/{p}")
            ax.plot(steps, mean, label={"mopd": "MOPD", "grpo": "GRPO, no KL"}.get(run, run))
            ax.fill_between(steps, mean - se, mean + se, alpha=0.25)
        ax.set(title=f"{p}: rollout reward (mean of 5 steps, ± SE)", xlabel="step", ylabel="reward")
        ax.legend(fontsize=8)
    if "mopd" in runs:
        for p, style in zip(PLATFORMS, ("-", "--"), strict=True):
            steps, mean, se = curve("mopd", f"k3/{p}")
            axes[2].plot(steps, mean, style, label=f"MOPD {p}")
        steps, mean, _ = curve("mopd", "grad_ratio")
        axes[3].plot(steps, mean)
    axes[2].set(title="MOPD: K3 to the routed teacher per token", xlabel="step", ylabel="K3", yscale="log")
    axes[3].set(title="MOPD: beta |grad K3| / |grad PG|", xlabel="step", ylabel="ratio", yscale="log")
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _smooth(v: list[float], k: int = 5) -> list[float]:
    out = []
    for i in range(len(v)):
        w = [x for x in v[max(0, i - k + 1) : i + 1] if x == x]
        out.append(float(np.mean(w)) if w else float("nan"))
    return out

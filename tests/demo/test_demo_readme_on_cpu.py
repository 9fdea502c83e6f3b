"""scripts/demo_readme.py's pure write-up of ``beta-seeds`` (the runs themselves are the demo's, tested elsewhere)."""

import importlib.util
import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from verl_mopd.demo.config import MODELS
from verl_mopd.demo.report import windows

_spec = importlib.util.spec_from_file_location("demo_readme", Path(__file__).parents[2] / "scripts" / "demo_readme.py")
demo_readme = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(demo_readme)


def _seed(seed, acc):
    return {"seed": seed, "eval": {m: {p: {"acc": a, "reward": 2 * a - 1} for p, a in accs.items()}
                                   for m, accs in acc.items()}}


def _runs(n=5):
    rng = np.random.default_rng(3)
    default = [{m: {p: float(rng.uniform(0.3, 0.5)) for p in ("desktop", "mobile")} for m in MODELS} for _ in range(n)]
    for r in default:
        r["MOPD student"] = {"desktop": 0.95, "mobile": 0.80}
    other = [{"MOPD student": {"desktop": 0.96, "mobile": 0.80 + 0.02 * i}} for i in range(n)]
    return default, other


def test_beta_block_pairs_the_two_betas_per_seed_and_judges_the_other_against_the_default_baselines():
    default, other = _runs()
    other[3]["MOPD student"]["mobile"] = 0.41  # among the baselines on seed 6's mobile
    seeds = [3 + i for i in range(5)]
    block = demo_readme.beta_block([_seed(s, r) for s, r in zip(seeds, default)],
                                   [_seed(s, r) for s, r in zip(seeds, other)], 0.3, 0.5)
    lines = block.splitlines()
    assert lines[0] == "| seed | MOPD acc, beta 0.3 | beta 0.5 | difference |"
    assert lines[2] == "| 3 | 0.950 / 0.800 | 0.960 / 0.800 | +0.010 / +0.000 |"
    assert lines[5] == "| 6 | 0.950 / 0.800 | 0.960 / 0.410 | +0.010 / -0.390 |"
    mobile = [o["MOPD student"]["mobile"] - 0.80 for o in other]
    paired = next(x for x in lines if x.startswith("beta 0.5 minus beta 0.3"))
    assert paired == (f"beta 0.5 minus beta 0.3, paired over 5 seeds: desktop +0.010 ± 0.000 (above; ahead on 5 of 5); "
                      f"mobile {statistics.fmean(mobile):+.3f} ± {statistics.stdev(mobile) / math.sqrt(5):.3f} "
                      f"(tie; ahead on 3 of 5).")
    # beta 0.5's MOPD against the default run's baselines: seed 6's mobile breaks the 2 windows holding it,
    # where the default run's MOPD holds all 3
    assert all(w["holds"] for w in windows([_seed(s, r) for s, r in zip(seeds, default)]))
    verdict = lines[-1]
    assert verdict.startswith("At beta 0.5 MOPD is above *GRPO, no KL*, *weight average* and *TIES* on both "
                              "platforms by more than 2 paired standard errors in **1 of 3** windows")
    assert "seeds 3-5" not in verdict and "; not in seeds 4-6 (" in verdict and "); seeds 5-7 (" in verdict
    assert " mobile " in verdict and " desktop " not in verdict


def test_beta_block_refuses_runs_of_other_seeds():
    default, other = _runs(3)
    with pytest.raises(ValueError, match=r"other seeds: \[0, 1, 2\] vs \[0, 1, 3\]"):
        demo_readme.beta_block([_seed(i, r) for i, r in enumerate(default)],
                               [_seed(s, r) for s, r in zip((0, 1, 3), other)], 0.3, 0.5)

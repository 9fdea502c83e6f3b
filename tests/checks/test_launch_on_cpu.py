"""Every hydra launch runs the whole recipe check before Ray starts (``verl_mopd.checks.launch``).

The launch paths: ``verl-mopd validate-recipe`` (tests/test_cli_on_cpu.py), our entry point
(tests/checks/test_recipes_on_cpu.py) and, here, verl's stock ``main_ppo``, which knows nothing of
verl-mopd: the check reaches it through ``mopd_base.yaml``'s hydra callback. A cross-section mistake
stops stock ``main_ppo`` with the very sentence ``validate-recipe`` prints.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from verl_mopd.checks.launch import CheckRecipe
from verl_mopd.checks.recipe_cli import compose_recipe, validate_recipe_cli
from verl_mopd.config import MOPDConfig
from verl_mopd.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
MULTI_DOMAIN = ROOT / "examples" / "multi_domain_text" / "recipe.yaml"  # run on stock main_ppo
SMALL = ROOT / "recipes" / "ui_mopd" / "stage2_mopd_small.yaml"  # worker teachers desktop, mobile; quota sampler


def _main_ppo(recipe: Path, overrides: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", f"--config-path={recipe.parent}",
         f"--config-name={recipe.stem}", *overrides],
        capture_output=True, text=True, timeout=300, cwd=cwd,  # hydra writes outputs/ in the cwd
    )


def test_the_callback_refuses_unknown_and_removed_keys():
    check = CheckRecipe()
    check.on_job_start(compose_recipe(str(MULTI_DOMAIN)))  # the example as shipped passes
    with pytest.raises(SystemExit, match=r"mopd.tau_k1: unknown key; did you mean mopd.tau_kl\?"):
        check.on_job_start(compose_recipe(str(MULTI_DOMAIN), ["+mopd.tau_k1=0.5"]))
    with pytest.raises(SystemExit, match="mopd.platform_key was removed: the platform column has one name"):
        check.on_job_start(compose_recipe(str(MULTI_DOMAIN), ["+mopd.platform_key=domain"]))
    with pytest.raises(ConfigError):  # what the trainers raise from the same check
        MOPDConfig.from_mapping({"tau_k1": 0.5})


def test_the_callback_runs_the_cross_section_checks():
    with pytest.raises(SystemExit) as stop:
        CheckRecipe().on_job_start(compose_recipe(str(MULTI_DOMAIN), ["actor_rollout_ref.rollout.temperature=0.7"]))
    assert str(stop.value.code).startswith("verl-mopd: actor_rollout_ref.rollout.temperature=0.7")


def test_mopd_base_registers_the_callback():
    base = OmegaConf.load(ROOT / "verl_mopd" / "trainer" / "config" / "mopd_base.yaml")
    targets = [c["_target_"] for c in base.hydra.callbacks.values()]
    assert "verl_mopd.checks.launch.CheckRecipe" in targets


def test_stock_main_ppo_refuses_a_mistyped_mopd_key_before_starting_ray(tmp_path):
    out = _main_ppo(MULTI_DOMAIN, ["+mopd.tau_k1=0.5"], tmp_path)
    assert out.returncode != 0
    assert "mopd.tau_k1: unknown key; did you mean mopd.tau_kl?" in out.stderr, out.stderr[-3000:]
    assert "ray init" not in out.stdout and "Started a local Ray instance" not in out.stderr


def test_stock_main_ppo_stops_on_validate_recipes_cross_section_problems_before_starting_ray(tmp_path, capsys):
    """Rollout temperature 0.7, a data platform without a teacher and a quota share without a teacher,
    in one launch: each is the line ``validate-recipe`` prints for the same overrides."""
    data = tmp_path / "train.parquet"
    pq.write_table(pa.table({"platform": ["desktop", "mobile", "tablet"], "prompt": ["a", "b", "c"]}), data)
    overrides = ["actor_rollout_ref.rollout.temperature=0.7", f"data.train_files={data}",
                 "trainer.v1.sampler.sampler_kwargs.quota.shares.mobile=0.25",
                 "+trainer.v1.sampler.sampler_kwargs.quota.shares.tablet=0.25"]
    assert validate_recipe_cli(str(SMALL), overrides) == 1
    expected = [line.removeprefix("ERROR: ") for line in capsys.readouterr().err.splitlines()
                if line.startswith("ERROR: ")]
    assert len(expected) == 3, expected
    assert expected[0].startswith("actor_rollout_ref.rollout.temperature=0.7")
    assert expected[1] == "train data has platform value(s) ['tablet'] with no teacher; configured: ['desktop', 'mobile']"
    assert expected[2].startswith("trainer.v1.sampler.sampler_kwargs.quota.shares has domains "
                                  "['desktop', 'mobile', 'tablet'] but the teachers serve ['desktop', 'mobile']")

    out = _main_ppo(SMALL, overrides, tmp_path)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "verl-mopd: the config has problems:\n" + "".join(f"  - {p}\n" for p in expected) in out.stderr + "\n", \
        out.stderr[-3000:]
    assert "verl-mopd: WARNING: data.val_files=" in out.stderr  # warnings are printed, as validate-recipe does
    assert "Started a local Ray instance" not in out.stderr

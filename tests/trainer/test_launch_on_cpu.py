"""An unknown ``mopd`` key stops every launch path before Ray starts (``verl_mopd.trainer.launch``).

The three paths: ``verl-mopd validate-recipe`` (tests/test_cli_on_cpu.py), our entry point
(tests/trainer/test_recipes_on_cpu.py) and, here, verl's stock ``main_ppo``, which knows nothing of
verl-mopd: the check reaches it through ``mopd_base.yaml``'s hydra callback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_mopd.config import MOPDConfig
from verl_mopd.errors import ConfigError
from verl_mopd.trainer.launch import CheckMopdBlock

ROOT = Path(__file__).resolve().parents[2]
MULTI_DOMAIN = ROOT / "examples" / "multi_domain_text" / "recipe.yaml"  # run on stock main_ppo


def test_the_callback_refuses_unknown_and_removed_keys():
    check = CheckMopdBlock()
    check.on_job_start(OmegaConf.create({"mopd": {"tau_kl": 0.5}}))
    check.on_job_start(OmegaConf.create({"algorithm": {}}))  # a plain verl run has no mopd block
    with pytest.raises(SystemExit, match=r"mopd.tau_k1: unknown key; did you mean mopd.tau_kl\?"):
        check.on_job_start(OmegaConf.create({"mopd": {"tau_k1": 0.5}}))
    with pytest.raises(SystemExit, match="mopd.platform_key was removed: the platform column has one name"):
        check.on_job_start(OmegaConf.create({"mopd": {"platform_key": "domain"}}))
    with pytest.raises(ConfigError):  # what the trainers raise from the same check
        MOPDConfig.from_mapping({"tau_k1": 0.5})


def test_mopd_base_registers_the_callback():
    base = OmegaConf.load(ROOT / "verl_mopd" / "trainer" / "config" / "mopd_base.yaml")
    targets = [c["_target_"] for c in base.hydra.callbacks.values()]
    assert "verl_mopd.trainer.launch.CheckMopdBlock" in targets


def test_stock_main_ppo_refuses_a_mistyped_mopd_key_before_starting_ray(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", f"--config-path={MULTI_DOMAIN.parent}",
         f"--config-name={MULTI_DOMAIN.stem}", "+mopd.tau_k1=0.5"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,  # hydra writes outputs/ in the cwd
    )
    assert out.returncode != 0
    assert "mopd.tau_k1: unknown key; did you mean mopd.tau_kl?" in out.stderr, out.stderr[-3000:]
    assert "ray init" not in out.stdout and "Started a local Ray instance" not in out.stderr

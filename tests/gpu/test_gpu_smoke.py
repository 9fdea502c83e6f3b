"""``verl-mopd smoke --device cuda``: both stages on one GPU (Megatron-Core student and teacher, SGLang).
Skipped without CUDA; needs the GPU install of the README."""

import json
import subprocess
import sys

import pytest


@pytest.mark.gpu
def test_gpu_smoke_run(tmp_path):
    out = tmp_path / "smoke"
    result = subprocess.run([sys.executable, "-m", "verl_mopd.cli", "smoke", "--device", "cuda", "--out", str(out)],
                            capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-4000:]
    assert all(c["result"] == "PASS" for c in json.loads((out / "checks.json").read_text())["checks"])

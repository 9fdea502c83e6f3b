"""The real entry point on one GPU for 3 steps (scripts/gpu_smoke.sh). Skipped without CUDA."""

import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).parents[2]


@pytest.mark.gpu
def test_gpu_smoke_run(tmp_path):
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_smoke.sh"), str(tmp_path / "smoke")],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "SMOKE OK" in out.stdout

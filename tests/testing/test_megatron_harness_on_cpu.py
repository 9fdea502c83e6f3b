"""The Megatron CPU harness's patches name upstream lines that still say what the harness assumes.

:mod:`verl_mopd.testing.cpu.megatron_patches` lists every monkeypatch of the harness with the upstream
``file:line`` it stands in for, and every CUDA call site the redirect answers. A pin bump that moves
any of them fails here, naming the line, before an engine test fails somewhere deep in Megatron.
(The harness is never imported in this process, only in subprocesses: it installs itself on import.)
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_mopd.testing.cpu.megatron_patches import PATCHES, REDIRECTED_CALL_SITES

pytestmark = pytest.mark.skipif(importlib.util.find_spec("megatron.bridge") is None,
                                reason="needs megatron-core and Megatron-Bridge (the test extra, Python 3.12)")


def upstream_line(site: str) -> str:
    """The text of ``package/relative/file.py:LINE`` in the installed packages."""
    relative, line = site.rsplit(":", 1)
    for root in sys.path:
        path = Path(root or ".") / relative
        if path.is_file():
            lines = path.read_text(encoding="utf-8").splitlines()
            assert int(line) <= len(lines), f"{site}: the file has only {len(lines)} lines"
            return lines[int(line) - 1]
    raise AssertionError(f"{relative} is not in any installed package (sys.path)")


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.upstream)
def test_each_patch_names_the_upstream_line_it_stands_in_for(patch):
    assert patch.expect in upstream_line(patch.upstream), (
        f"{patch.upstream} no longer reads {patch.expect!r}: re-read it and update the harness patch of "
        f"{patch.target} ({patch.why})")


@pytest.mark.parametrize("site", [f"{f}:{line}" for f, lines in sorted(REDIRECTED_CALL_SITES.items()) for line in lines])
def test_each_redirected_call_site_still_calls_cuda(site):
    assert "cuda" in upstream_line(site).lower(), f"{site} no longer names CUDA: the recorded call sites moved"


def test_the_patch_list_covers_every_library_the_harness_touches():
    files = {p.upstream.split("/", 2)[0] + "/" + p.upstream.split("/", 2)[1] for p in PATCHES}
    assert {"megatron/core", "megatron/bridge", "verl/workers", "verl/utils"} <= files
    assert len({p.target for p in PATCHES}) == len(PATCHES)  # one entry per replaced attribute


def test_the_harness_installs_each_patch_when_its_module_is_first_imported(tmp_path):
    """``import verl`` with the harness imports neither verl's engines nor megatron (a Ray worker that builds no
    model pays for neither); the first import of verl's engines installs the registrations and megatron-core's
    patches but not Megatron-Bridge, whose first import (as verl's model builder does it) installs the rest."""
    from verl_mopd.testing.cpu import environment

    script = """
import sys
import verl
before = sorted(m for m in ("verl.workers.engine", "megatron.core", "megatron.bridge") if m in sys.modules)
import verl.workers.engine
import verl.models.mcore.model_forward_fused as fused
after_engines = sorted(m for m in ("megatron.core", "megatron.bridge") if m in sys.modules)
from verl.models.mcore.bridge import AutoBridge  # what verl's Megatron engine imports to build a model
from megatron.bridge.models import gpt_provider
from verl.workers.config.engine import McoreEngineConfig
from verl.workers.engine.base import EngineRegistry
import verl_mopd.testing.cpu.megatron as harness
print("before", before)
print("after_engines", after_engines)
print("te", sorted(m for m in sys.modules if m.startswith("transformer_engine")))
print("engines", sorted(b for b, devices in EngineRegistry._engines["language_model"].items() if "cpu" in devices))
print("patched", gpt_provider.transformer_engine_layer_spec is harness.cpu_gpt_layer_spec,
      fused.linear_cross_entropy is harness.torch_linear_cross_entropy,
      getattr(McoreEngineConfig.__post_init__, "_cpu_harness", False), harness.CPUDotProductAttention is not None)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, **environment(megatron=True)}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert lines["before"] == "[]"
    assert lines["after_engines"] == "['megatron.core']"
    assert lines["te"] == "[]"  # the stand-in is gone once Megatron-Bridge is in
    assert lines["engines"] == "['fsdp', 'fsdp2', 'megatron']"
    assert lines["patched"] == "True True True True"


def test_the_harness_refuses_megatron_bridge_imported_before_megatron_core(tmp_path):
    from verl_mopd.testing.cpu import environment

    done = subprocess.run([sys.executable, "-c", "import verl, megatron.bridge"], capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, **environment(megatron=True)}, cwd=tmp_path)
    assert done.returncode != 0
    assert "megatron.bridge is being imported before megatron.core" in done.stderr

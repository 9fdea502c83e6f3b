"""The CPU harness registers into verl's registries only where a process asks for it, in every import order."""

import json
import os
import subprocess
import sys

from verl_mopd.testing.cpu import PLATFORM_MODULE, environment

PROBE = """
import json, sys
first = sys.argv[1]
if first == "rollout":  # as a Ray worker that unpickles the rollout classes before anything else
    import verl_mopd.testing.cpu.rollout  # noqa: F401
import verl
import torch
from verl.plugin.platform.platform_manager import PlatformRegistry
from verl.utils.device import get_device_id, get_device_name, get_nccl_backend, get_torch_device
from verl.utils import distributed
from verl.workers.engine.base import EngineRegistry
from verl.workers.rollout import base
from verl.workers.rollout.replica import RolloutReplicaRegistry
from verl.trainer.distillation.losses import DISTILLATION_LOSS_REGISTRY
out = {"platforms": sorted(PlatformRegistry.registered_names()), "mopd_k3": "mopd_k3" in DISTILLATION_LOSS_REGISTRY,
       "hf_adapter": base._ROLLOUT_REGISTRY.get(("hf", "async"))}
if "cpu" in out["platforms"]:
    out.update(device=get_device_name(), device_id=get_device_id(), backend=get_nccl_backend(),
               engine=EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__,
               replica=RolloutReplicaRegistry.get("hf").__name__,
               gloo_default=distributed.initialize_global_process_group_ray.__defaults__,
               memory=get_torch_device().memory_allocated() > 0)
    torch.zeros(2).to(get_device_id())  # an int device id would mean cuda:0
    try:
        get_torch_device().not_a_cuda_call
    except AttributeError as exc:
        out["unknown_call"] = str(exc)
print("PROBE" + json.dumps(out, default=str))
"""


def _probe(first: str, env: dict) -> dict:
    result = subprocess.run([sys.executable, "-c", PROBE, first], capture_output=True, text=True, timeout=300,
                            env={**os.environ, **env})
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(l for l in result.stdout.splitlines() if l.startswith("PROBE"))
    return json.loads(line[len("PROBE"):])


def test_the_harness_environment_puts_verl_on_cpu_in_either_import_order():
    for first in ("verl", "rollout"):
        out = _probe(first, environment())
        assert "cpu" in out["platforms"] and out["mopd_k3"], out
        assert (out["device"], out["device_id"], out["backend"]) == ("cpu", "cpu", "gloo")
        assert out["engine"] == "FSDPEngineWithLMHead" and out["replica"] == "HFReplica"
        assert out["hf_adapter"] == "verl_mopd.testing.cpu.rollout.HFServerAdapter"
        assert out["gloo_default"][1] == "gloo" and out["memory"]
        assert "not_a_cuda_call" in out["unknown_call"]


def test_without_the_harness_environment_verl_never_sees_the_cpu_platform():
    """GPU users: the verl.plugins entry point registers mopd_k3 and nothing of the harness."""
    env = {k: "" for k in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES")}
    out = _probe("verl", env)
    assert "cpu" not in out["platforms"] and out["hf_adapter"] is None and out["mopd_k3"]


def test_the_platform_module_without_verl_platform_cpu_is_a_clear_error():
    env = {**environment(), "VERL_PLATFORM": ""}
    result = subprocess.run([sys.executable, "-c", "import verl"], capture_output=True, text=True, timeout=300,
                            env={**os.environ, **env})
    assert result.returncode != 0 and "set VERL_PLATFORM=cpu" in result.stderr
    assert PLATFORM_MODULE in result.stderr


def test_the_harness_environment_hides_torchs_no_cuda_runtime_warning_in_every_worker(tmp_path):
    """Every worker inherits environment(); one that imports torch.utils.cpp_extension (megatron-core does) on
    a CPU machine with a CUDA toolkit (CUDA_HOME) would log "No CUDA runtime is found" without TORCH_LOGS."""
    import torch

    if torch.cuda.is_available():
        return  # torch logs it only where it sees no CUDA device
    base = {k: v for k, v in os.environ.items() if k != "TORCH_LOGS"}
    base["CUDA_HOME"] = str(tmp_path)
    probe = [sys.executable, "-c", "import torch.utils.cpp_extension"]
    control = subprocess.run(probe, capture_output=True, text=True, timeout=300, env=base, check=False)
    assert "No CUDA runtime is found" in control.stderr, control.stderr[-2000:]
    for env in (environment(), environment(megatron=True, gpus=2)):
        quiet = subprocess.run(probe, capture_output=True, text=True, timeout=300, env={**base, **env}, check=False)
        assert quiet.returncode == 0 and "No CUDA runtime is found" not in quiet.stderr, quiet.stderr[-2000:]

"""verl 0.9.1's real trainers on CPU: a ``cpu`` platform, verl's FSDP engines for it, gloo, and an
``hf`` rollout engine built on transformers' ``generate`` (Qwen3-VL with images included).

verl ships no CPU path: it has no ``cpu`` platform (auto-detection falls back to CUDA), registers
its FSDP engines only for ``cuda``/``npu``, builds a ``cpu:gloo,cpu:gloo`` process-group string on a
CPU device, asks Ray for GPUs in every resource pool, and its rollout registries hold only vLLM,
SGLang and TRT-LLM. Everything this package adds goes through verl's public registries
(``PlatformRegistry``, ``EngineRegistry``, ``RolloutReplicaRegistry``, the rollout class table) and
one default argument; nothing of verl is copied or edited.

How a process gets it (every Ray worker inherits the environment; :func:`environment` returns it)::

    VERL_PLATFORM=cpu VERL_USE_EXTERNAL_MODULES=verl_mopd.testing.cpu.platform \
    RAY_OVERRIDE_RESOURCES='{"CPU": 16, "GPU": 1}' python -m verl_mopd.trainer.main ...

``RAY_OVERRIDE_RESOURCES`` gives any ``ray.init()`` (verl's SFT trainer calls it bare) fake GPUs
(one by default) and 16 logical CPUs each for verl's resource pools and Ray actors. The run config comes from a recipe's
CPU layout (``recipes/ui_mopd/layout/stage{1,2}_cpu.yaml``: the FSDP engine in fp32, sdpa, no
``torch.compile``, the ``hf`` rollout, one TransferQueue storage unit). Never import
``verl_mopd.testing.cpu.platform`` yourself: ``import verl`` loads it (through
``VERL_USE_EXTERNAL_MODULES``) before it loads the ``verl.plugins`` entry points, and that order is
what lets every verl module see the ``cpu`` platform.

This package imports nothing at import time (it is imported in every Ray worker that unpickles the
rollout classes, possibly before verl).
"""

from __future__ import annotations

import json

PLATFORM_MODULE = "verl_mopd.testing.cpu.platform"
MEGATRON_MODULE = "verl_mopd.testing.cpu.megatron"

__all__ = ["PLATFORM_MODULE", "MEGATRON_MODULE", "environment"]


def environment(threads: int = 1, megatron: bool = False, gpus: int = 1) -> dict[str, str]:
    """The environment variables that put verl (and every Ray worker it starts) on the CPU harness.

    Args:
        threads: torch / OpenMP threads per process (a CPU run starts ~10 processes).
        megatron: also load :mod:`verl_mopd.testing.cpu.megatron` (verl's Megatron engine on CPU: needs
            megatron-core and Megatron-Bridge); and keep verl's ``torch.compile`` calls from compiling.
        gpus: the fake GPUs Ray is given (a TP 2 actor needs 2; each is one process on the CPU).

    ``TORCH_LOGS`` keeps the caller's setting and adds ``-torch.utils.cpp_extension``
    (:func:`verl_mopd.quiet.torch_logs`): every worker that imports megatron-core would log torch's "No
    CUDA runtime is found" on a CPU machine with a CUDA toolkit.
    """
    import os

    from verl_mopd.quiet import torch_logs

    modules = [PLATFORM_MODULE, MEGATRON_MODULE] if megatron else [PLATFORM_MODULE]
    return {
        **({"TORCHDYNAMO_DISABLE": "1"} if megatron else {}),
        "VERL_PLATFORM": "cpu",
        "VERL_USE_EXTERNAL_MODULES": ",".join(modules),
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_DEDUP_LOGS": "0",
        "TORCH_LOGS": torch_logs(os.environ.get("TORCH_LOGS")),
        "RAY_OVERRIDE_RESOURCES": json.dumps({"CPU": 16 * gpus, "GPU": gpus}),
    }

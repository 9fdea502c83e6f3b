"""The CPU harness's registrations; loaded by ``VERL_USE_EXTERNAL_MODULES`` inside ``import verl``.

The platform and the process-group default are set at load; the engine and rollout registrations
right after verl's module that holds each registry is first imported
(:func:`verl_mopd.plugin.after_import`, strict), so a Ray worker that builds no engine never imports
verl's engines (~3 s of a core each, on CPU).

What each registration gets past in verl 0.9.1 (module and function named, so a verl upgrade that
moves them fails here, loudly):

- ``PlatformRegistry.register("cpu")`` (``verl/plugin/platform``): verl resolves its device through
  the platform selected by ``VERL_PLATFORM``; without a ``cpu`` one it falls back to CUDA.
  ``current_device()`` is the string ``"cpu"`` because verl hands ``get_device_id()`` straight to
  ``.to()`` / ``.to_empty()``, where an int means ``cuda:N``. ``ray_resource_name()`` is ``"GPU"``:
  verl's resource pools always ask Ray for GPUs, so a CPU run starts Ray with fake ones
  (``ray_init.num_gpus``); Ray only sets ``CUDA_VISIBLE_DEVICES`` for them, which CPU torch ignores.
- ``EngineRegistry``: verl registers its FSDP engines (``FSDPEngineWithLMHead``,
  ``FSDPEngineWithValueHead``) for ``device=["cuda", "npu"]``; the same classes are registered for
  ``cpu``. FSDP2 over a one-rank gloo mesh runs as is.
- ``verl.utils.distributed.initialize_global_process_group_ray``: its default backend string is
  ``f"cpu:gloo,{device}:{backend}"``, which on CPU is ``"cpu:gloo,cpu:gloo"`` and torch rejects the
  duplicate device; its default becomes plain ``"gloo"``. This is the one default we change.
- the rollout registries (``verl.workers.rollout.base._ROLLOUT_REGISTRY`` for the worker-side
  adapter, ``RolloutReplicaRegistry`` for the server): ``actor_rollout_ref.rollout.name=hf`` selects
  ``verl_mopd.testing.cpu.rollout``.
- ``qwen_vl_utils``: verl's datasets read images through it, and it imports torchvision at module
  level, which cannot load beside a CPU build of torch (no CPU torchvision wheel is on PyPI). Only
  when it cannot be imported, :mod:`verl_mopd.testing.cpu.vision` (its image path, in PIL) is
  installed under that name; videos are refused there.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

from verl_mopd.plugin import after_import

logger = logging.getLogger(__name__)

ROLLOUT_NAME = "hf"


class CPUDevice:
    """What verl calls on its device module (``get_torch_device()``, ``torch.cuda`` on GPUs), on CPU.

    Streams and events are ``torch.cpu``'s; memory figures are this process's resident set (verl
    logs them as ``perf/*memory*``); cache and IPC calls do nothing because there is nothing to free.
    Any other attribute is an ``AttributeError`` naming it, so a verl call this class misses is seen.
    """

    Stream = torch.cpu.Stream
    Event = torch.cpu.Event
    stream = staticmethod(torch.cpu.stream)
    current_stream = staticmethod(torch.cpu.current_stream)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def get_device_name(*_args) -> str:
        return "CPU"  # verl's flops counter matches device-name substrings (no GPU name matches)

    @staticmethod
    def set_device(*_args) -> None:
        pass

    @staticmethod
    def synchronize(*_args) -> None:
        pass

    @staticmethod
    def empty_cache() -> None:
        pass

    @staticmethod
    def ipc_collect() -> None:
        pass

    @staticmethod
    def set_per_process_memory_fraction(*_args) -> None:
        pass

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def get_rng_state(*_args) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, *_args) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def _rss() -> int:
        import psutil

        return psutil.Process().memory_info().rss

    memory_allocated = memory_reserved = max_memory_allocated = max_memory_reserved = staticmethod(
        lambda *_args: CPUDevice._rss()
    )

    @staticmethod
    def mem_get_info(*_args) -> tuple[int, int]:
        import psutil

        vm = psutil.virtual_memory()
        return vm.available, vm.total

    def __getattr__(self, name: str):
        raise AttributeError(f"the CPU harness's device module has no {name!r} (verl called torch.cuda.{name})")


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """verl's platform interface on CPU (``VERL_PLATFORM=cpu``)."""

    _device = CPUDevice()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self):
        return self._device

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return True

    def current_device(self):
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        pass

    def synchronize(self, device_index=None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # what Ray sets for the fake GPUs

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        return "GPU"  # verl's resource pools count GPUs; a CPU run starts Ray with fake ones

    def ray_resource_options(self, num_gpus: float) -> dict:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self):
        return None


def _register_engines() -> None:
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    for model_type, engine in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        for backend in ("fsdp", "fsdp2"):
            EngineRegistry._engines.setdefault(model_type, {}).setdefault(backend, {}).setdefault("cpu", engine)


def _gloo_process_group() -> None:
    from verl.utils import distributed

    function = distributed.initialize_global_process_group_ray
    defaults = dict(zip(function.__code__.co_varnames[: function.__code__.co_argcount], function.__defaults__,
                        strict=True))
    if set(defaults) != {"timeout_second", "backend"}:
        raise RuntimeError(
            "verl.utils.distributed.initialize_global_process_group_ray changed its signature "
            f"({sorted(defaults)}); the CPU harness sets its default backend to 'gloo' and needs updating"
        )
    function.__defaults__ = (defaults["timeout_second"], "gloo")


def _register_rollout_adapter() -> None:
    from verl.workers.rollout import base

    base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = "verl_mopd.testing.cpu.rollout.HFServerAdapter"


def _register_rollout_replica() -> None:
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    def load():
        from verl_mopd.testing.cpu.rollout import HFReplica

        return HFReplica

    RolloutReplicaRegistry.register(ROLLOUT_NAME, load)


def _image_reader() -> None:
    try:
        importlib.import_module("qwen_vl_utils")
    except Exception as exc:  # noqa: BLE001 - ImportError, or torchvision's RuntimeError on load
        from verl_mopd.testing.cpu import vision

        sys.modules["qwen_vl_utils"] = vision
        logger.info("qwen_vl_utils is not importable here (%s); images are read by %s", exc, vision.__name__)


def install() -> None:
    """All registrations (idempotent); runs when ``import verl`` loads this module."""
    if os.environ.get("VERL_PLATFORM", "").strip().lower() != "cpu":
        raise RuntimeError(
            f"{__name__} is loaded (VERL_USE_EXTERNAL_MODULES) but VERL_PLATFORM="
            f"{os.environ.get('VERL_PLATFORM')!r}: set VERL_PLATFORM=cpu as well, or neither"
        )
    _gloo_process_group()
    # right after verl's module that holds each registry is imported: a Ray worker that never builds an
    # engine (storage units, reward and agent-loop workers, rollout servers) never imports verl's engines
    after_import("verl.workers.engine", _register_engines, strict=True)
    after_import("verl.workers.rollout.base", _register_rollout_adapter, strict=True)
    after_import("verl.workers.rollout.replica", _register_rollout_replica, strict=True)
    _image_reader()


install()

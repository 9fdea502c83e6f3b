"""verl 0.9.1's Megatron engine on CPU: megatron-core and Megatron-Bridge (Qwen3-VL included) over gloo.

Loaded like the rest of the CPU harness, by ``VERL_USE_EXTERNAL_MODULES`` inside ``import verl``, after
:mod:`verl_mopd.testing.cpu.platform` (``environment(megatron=True)`` names both), never through the
plugin's entry point: a GPU run never sees any of this.

At load it only replaces ``torch.cuda``'s device functions and turns the CUDA redirect on for the loading
thread; everything else runs right after the module it patches is first imported
(:func:`verl_mopd.plugin.after_import`, strict: a failure fails that import), and Megatron-Bridge is
imported only where verl imports it, to build or save a Megatron model: the Ray workers that never
import megatron-core (TransferQueue storage units, reward workers) skip it and the patches, and those that
import verl's engines without building one (the trainer's driver, the agent loop, the ``hf`` rollout
servers) skip Megatron-Bridge: ~4 s of a core each, on CPU.

What it takes, registrations first (verl's or Megatron's own hooks), then the patches neither offers.
Every patch is a :class:`Patch` in :data:`PATCHES`: the attribute it replaces, the upstream file and
line whose behaviour it changes, and the text expected on that line.
``tests/testing/test_megatron_harness_on_cpu.py`` reads each line from the installed packages, so a
pin bump that moves one fails there, by name.

Registrations:

- ``EngineRegistry``: verl registers ``MegatronEngineWithLMHead`` / ``...WithValueHead`` for ``cuda``
  only; :class:`CPUMegatronEngineWithLMHead` (and the value head) are registered for ``cpu``. They are
  verl's classes with every public method run under the CUDA redirect below, on whatever thread calls
  it (a torch function mode is per thread).
- Megatron-Core's module specs: the GPT layer, the ViT layer, the Qwen3-VL patch merger and a
  block's final norm are built from megatron's *local* spec (no Transformer Engine) with two
  modules of ours swapped in: :class:`CPUNorm` (torch's RMSNorm / LayerNorm whose weights carry
  ``sequence_parallel``, as TE's do, so ``finalize_model_grads`` all-reduces them under sequence
  parallelism) and :class:`CPUDotProductAttention` (megatron's ``DotProductAttention`` plus the packed
  THD layout that TE's attention takes: one block-diagonal mask over the pack, causal or not).
  Megatron-Bridge takes a spec as a provider field, but its GPT provider's default and Qwen3-VL's
  provider and model name TE's spec functions at module level, so those names are patched.

Patches (:data:`PATCHES`):

- the CUDA redirect: megatron-core allocates with ``device="cuda"``, asks ``torch.cuda`` for the
  current device, streams and RNG state, asserts ``tensor.type() == "torch.cuda.FloatTensor"``, and
  verl offloads into pinned host memory (the call sites met in the tests are in
  :data:`REDIRECTED_CALL_SITES`; ``VERL_MOPD_CPU_RECORD=PREFIX`` makes each process write the ones it
  met). A :class:`~torch.overrides.TorchFunctionMode` maps CUDA devices to the CPU, pinned memory to
  plain memory, and answers ``type()`` as CUDA would; ``torch.cuda``'s device, stream, RNG and memory
  functions get CPU stand-ins;
- megatron's RNG tracker reads and sets the CPU generator (else ``fork()`` silently does not fork);
- the first ``import megatron.bridge`` runs with a stand-in ``transformer_engine`` module (Megatron-Bridge
  0.6.2 imports ``transformer_engine.pytorch`` unconditionally in modules the GPT and Qwen3-VL paths
  never call), after megatron-core's TE-aware modules have chosen their non-TE branches;
- verl's fused log-prob kernel (Triton, CUDA only) is computed in torch with verl's own
  vocab-parallel functions, so ``use_fused_kernels: true`` layouts run unchanged;
- ``McoreEngineConfig`` admits ``float32`` (verl allows ``bfloat16`` / ``float16``; the CPU checks
  compare against transformers in fp32);
- a resume of megatron's distributed optimizer: without Transformer Engine or Apex it reads the step
  from torch Adam's per-parameter state, which is empty before a first step (it is filled as it is
  then: step 0, zero moments, which changes nothing a step computes); and in fp32 its main parameters
  are views of the model's, which the load copies into in place (under ``no_grad``, as a load is).

``TORCHDYNAMO_DISABLE=1`` (in :func:`verl_mopd.testing.cpu.environment`) keeps verl's
``torch.compile`` of its vocab-parallel entropy from compiling for 40 s on CPU.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import threading
import traceback
import types
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

from verl_mopd.plugin import after_import
from verl_mopd.testing.cpu.megatron_patches import PATCHES, REDIRECTED_CALL_SITES

__all__ = [
    "PATCHES",
    "REDIRECTED_CALL_SITES",
    "CPUDotProductAttention",
    "CPUNorm",
    "cpu_gpt_layer_spec",
    "cuda_redirect",
    "install",
]


# ------------------------------------------------------------------------------------ the CUDA redirect
_RECORD = os.environ.get("VERL_MOPD_CPU_RECORD")  # a file: every redirected call's first outside site
_SITES: Counter = Counter()
_PACKAGES = ("megatron/", "verl/", "mbridge/")


def _record(what: str) -> None:
    if not _RECORD:
        return
    for frame in reversed(traceback.extract_stack()[:-2]):
        name = frame.filename.replace(os.sep, "/")
        if "site-packages/" in name and name.split("site-packages/", 1)[1].startswith(_PACKAGES):
            _SITES[f"{name.split('site-packages/', 1)[1]}:{frame.lineno}"] += 1
            return
    _SITES[f"(outside the packages) {what}"] += 1


def _is_cuda(device) -> bool:
    if isinstance(device, bool):
        return False
    if isinstance(device, int):
        return True  # an int device is cuda:N to torch
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


class _CudaToCPU(TorchFunctionMode):
    """CUDA devices in torch calls become the CPU, pinned host memory plain memory; ``Tensor.type()``
    answers ``torch.cuda.*``."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            _record("Tensor.cuda()")
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            if name.startswith("torch.") and not name.startswith("torch.cuda."):
                _record("Tensor.type()")
                return "torch.cuda." + name[len("torch."):]
            return name
        if func is torch.Tensor.pin_memory:
            _record("Tensor.pin_memory()")
            return args[0]
        if _is_cuda(kwargs.get("device")):
            _record("device=cuda")
            kwargs = {**kwargs, "device": "cpu"}
        if kwargs.get("pin_memory"):  # page-locking needs the CUDA driver; without a GPU it buys nothing
            _record("pin_memory=True")
            kwargs = {**kwargs, "pin_memory": False}
        if func is torch.Tensor.to and any(_is_cuda(a) for a in args[1:]):
            _record("Tensor.to(cuda)")
            args = tuple("cpu" if i and _is_cuda(a) else a for i, a in enumerate(args))
        return func(*args, **kwargs)


_MODE = _CudaToCPU()
_ACTIVE = threading.local()


class cuda_redirect:
    """The redirect on this thread (re-entrant; a torch function mode is per thread)."""

    def __enter__(self):
        self._entered = not getattr(_ACTIVE, "on", False)
        if self._entered:
            _ACTIVE.on = True
            _MODE.__enter__()
        return self

    def __exit__(self, *exc):
        if self._entered:
            _MODE.__exit__(*exc)
            _ACTIVE.on = False
        return False


class _Stream:
    """``torch.cuda.Stream`` / ``Event`` on CPU: everything is already in order."""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def wait_stream(self, *args, **kwargs):
        pass

    def wait_event(self, *args, **kwargs):
        pass

    def record_event(self, *args, **kwargs):
        return _Stream()

    def record(self, *args, **kwargs):
        pass

    def wait(self, *args, **kwargs):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0


def _counted(name: str, fn):
    def stand_in(*args, **kwargs):
        _record(f"torch.cuda.{name}")
        return fn(*args, **kwargs)

    stand_in.__name__ = name
    return stand_in


def _torch_cuda_stand_ins() -> None:
    cuda = torch.cuda
    default = torch.default_generator
    functions = {
        "current_device": lambda *a: "cpu",  # used as device=...: an int would mean cuda:N
        "set_device": lambda *a, **k: None,
        "device_count": lambda: 1,
        "synchronize": lambda *a, **k: None,
        "empty_cache": lambda: None,
        "ipc_collect": lambda: None,
        "current_stream": lambda *a, **k: _Stream(),
        "default_stream": lambda *a, **k: _Stream(),
        "stream": lambda *a, **k: _Stream(),
        "get_rng_state": lambda *a, **k: default.get_state(),
        "set_rng_state": lambda state, *a, **k: default.set_state(state),
        "manual_seed": lambda seed: default.manual_seed(int(seed)),  # torch.manual_seed would call back here
        "memory_allocated": lambda *a, **k: 0,
        "max_memory_allocated": lambda *a, **k: 0,
        "memory_reserved": lambda *a, **k: 0,
        "max_memory_reserved": lambda *a, **k: 0,
        "reset_peak_memory_stats": lambda *a, **k: None,
        "get_device_name": lambda *a, **k: "CPU",
    }
    for name, fn in functions.items():
        setattr(cuda, name, _counted(name, fn))
    cuda.Stream = cuda.Event = _Stream
    cuda.random.get_rng_state, cuda.random.set_rng_state = cuda.get_rng_state, cuda.set_rng_state


def _rng_tracker() -> None:
    import logging

    from megatron.core.tensor_parallel import random

    random._get_cuda_rng_state = lambda *args, **kwargs: torch.default_generator.get_state()
    random._set_cuda_rng_state = lambda state, *args, **kwargs: torch.default_generator.set_state(state)
    # fork() warns when the CPU generator moved inside a CUDA-RNG region: here they are the same generator
    logging.getLogger(random.__name__).addFilter(
        lambda record: "CPU RNG state changed within GPU RNG context" not in record.getMessage())


# ------------------------------------------------------------------------------------ module specs
class CPUNorm:
    """megatron's ``WrappedTorchNorm`` (torch ``RMSNorm`` / ``LayerNorm``) that supports sequence parallel.

    Under sequence parallelism each tensor-parallel rank normalizes its own sequence shard, so the
    norm's weight gradient is partial: its parameters carry ``sequence_parallel``, as Transformer
    Engine's norms do, and megatron's ``finalize_model_grads`` all-reduces them over the TP group.
    """

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                zero_centered_gamma: bool = False, normalization: str | None = None):
        if config.layernorm_zero_centered_gamma or zero_centered_gamma:
            raise ValueError("CPUNorm: zero-centered gamma is not supported (torch norms)")
        kind = config.normalization
        norms = {"RMSNorm": torch.nn.RMSNorm, "LayerNorm": torch.nn.LayerNorm}
        if kind not in norms:
            raise ValueError(f"CPUNorm: normalization={kind!r}; supported: {sorted(norms)}")
        module = norms[kind](hidden_size, eps=eps, dtype=config.params_dtype)
        for parameter in module.parameters():
            parameter.sequence_parallel = config.sequence_parallel
        return module


def _attention_base():
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    return DotProductAttention


def _segments(cu_seqlens: torch.Tensor, tokens: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each sequence of a THD pack of ``tokens`` tokens (empty ones dropped)."""
    bounds = [min(int(b), tokens) for b in cu_seqlens.tolist()]
    return [(start, end) for start, end in zip(bounds[:-1], bounds[1:], strict=True) if end > start]


#: megatron's ``DotProductAttention`` with the THD layout; defined by :func:`_make_attention` once megatron is imported
CPUDotProductAttention = None


def _make_attention():
    from megatron.core.transformer.enums import AttnMaskType

    base = _attention_base()

    class CPUDotProductAttention(base):
        """megatron's local ``DotProductAttention`` plus the packed THD layout TE's attention takes.

        THD: ``q, k, v`` are ``(t, heads, dim)`` with ``packed_seq_params.cu_seqlens_q(_padded)``; each
        sequence of the pack is attended on its own (causal for a causal layer, full for the ViT), as
        TE's varlen kernels do, so the cost is the sum of the squared lengths, not the pack's square.
        BSHD: verl passes a ``(b, s)`` keep-mask that a causal layer does not need (right padding
        never precedes a real token); TE ignores it, and so does this class.
        """

        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
            if packed_seq_params is None or packed_seq_params.qkv_format != "thd":
                if attention_mask is not None and attention_mask.dim() == 2 and mask_type == AttnMaskType.causal:
                    attention_mask = None
                return super().forward(query, key, value, attention_mask, attn_mask_type=attn_mask_type,
                                       attention_bias=attention_bias, packed_seq_params=packed_seq_params)
            cu_seqlens = packed_seq_params.cu_seqlens_q_padded
            if cu_seqlens is None:
                cu_seqlens = packed_seq_params.cu_seqlens_q
            causal = mask_type == AttnMaskType.causal
            outputs = []
            for start, end in _segments(cu_seqlens, query.shape[0]):
                mask = None
                if causal:  # megatron: True = masked
                    mask = torch.ones(end - start, end - start, dtype=torch.bool, device=query.device).triu(1)
                outputs.append(super().forward(query[start:end].unsqueeze(1), key[start:end].unsqueeze(1),
                                               value[start:end].unsqueeze(1), mask if mask is None else mask[None, None],
                                               attn_mask_type=attn_mask_type, attention_bias=attention_bias))
            return torch.cat(outputs, dim=0)

    CPUDotProductAttention.__module__ = __name__
    return CPUDotProductAttention


def _swap(spec):
    """``spec`` (a block or layer spec) with WrappedTorchNorm -> CPUNorm and DotProductAttention -> the
    THD-capable class, everywhere, in place."""
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    swaps = {WrappedTorchNorm: CPUNorm, _attention_base(): CPUDotProductAttention}

    def fix(node):
        if isinstance(node, type) and node in swaps:
            return swaps[node]
        if isinstance(node, ModuleSpec):
            node.module = fix(node.module)
            if node.submodules is not None:
                node.submodules = fix(node.submodules)
            return node
        if isinstance(node, list):
            return [fix(item) for item in node]
        if dataclasses.is_dataclass(node) and not isinstance(node, type):
            for f in dataclasses.fields(node):
                setattr(node, f.name, fix(getattr(node, f.name)))
        return node

    return fix(spec)


def cpu_gpt_layer_spec(config=None, num_experts=None, moe_grouped_gemm=False, qk_layernorm=None, **_unused):
    """megatron's local GPT layer spec with :class:`CPUNorm` and :class:`CPUDotProductAttention`.

    Callable in place of Megatron-Bridge's ``transformer_engine_layer_spec(config)`` (a provider) and of
    megatron's ``get_gpt_layer_with_transformer_engine_spec(num_experts=, moe_grouped_gemm=,
    qk_layernorm=, fp8=)``.
    """
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    if config is not None:
        num_experts = config.num_moe_experts
        qk_layernorm = config.qk_layernorm
        normalization = config.normalization
    else:
        normalization = "RMSNorm"
    return _swap(get_gpt_layer_local_spec(num_experts=num_experts, moe_grouped_gemm=moe_grouped_gemm,
                                          qk_layernorm=bool(qk_layernorm), normalization=normalization))


def _cpu_vit_layer_spec(*_args, **_kwargs):
    from megatron.core.models.vision.vit_layer_specs import get_vit_layer_with_local_spec

    return _swap(get_vit_layer_with_local_spec())


_TE_AWARE_MODULES = (  # megatron-core modules that try to import transformer_engine, imported before the stand-in
    "megatron.core.extensions.transformer_engine",
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.models.vision.vit_layer_specs",
    "megatron.core.models.multimodal.llava_model",
    "megatron.core.models.vision.clip_vit_model",
    "megatron.core.transformer.transformer_block",
    "megatron.core.post_training.modelopt.layers",
    "megatron.core.post_training.modelopt.gpt.model_specs",
    "megatron.core.ssm.mamba_context_parallel",
    "megatron.core.models.hybrid.hybrid_layer_specs",
)


class _Placeholder(type):
    """A class any attribute of which is another placeholder class (``te.ops.Sequential``), never called."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{cls.__name__}.{name}", (), {"__module__": cls.__module__})


class _TEStandIn(types.ModuleType):
    """``transformer_engine`` while ``megatron.bridge`` is imported: any attribute is a placeholder class."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        placeholder = _Placeholder(name, (), {"__module__": self.__name__})
        setattr(self, name, placeholder)
        return placeholder


#: what Megatron-Bridge's first import also imports under the stand-in (each imports transformer_engine)
_BRIDGE_MODULES = ("megatron.bridge.models.gpt_provider", "megatron.bridge.models.qwen_vl.qwen3_vl_provider",
                   "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model", "verl.models.mcore.bridge")


class _BridgeImport:
    """The first ``import megatron.bridge`` of a process, wrapped (a one-shot ``sys.meta_path`` finder whose
    loader runs the real one): megatron-core's TE-aware modules first (they choose their non-TE branches),
    then Megatron-Bridge and :data:`_BRIDGE_MODULES` with a ``transformer_engine`` stand-in, then the
    local-spec patches. verl imports Megatron-Bridge only where it builds or saves a Megatron model, so a
    process that imports verl's engines without building one (the trainer's driver, the agent loop, the
    ``hf`` rollout servers) skips it: ~4 s of a core each."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "megatron.bridge":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return None  # not installed: the importer gets its own ModuleNotFoundError
        self._loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = module.__spec__.loader = self._loader
        for name in _TE_AWARE_MODULES:
            try:
                importlib.import_module(name)
            except ImportError:
                pass  # not in this megatron-core
        from megatron.core.extensions import transformer_engine as mcore_te

        if mcore_te.HAVE_TE:
            raise RuntimeError("the Megatron CPU harness found Transformer Engine installed: it is for CPU-only envs")
        stand_ins = {name: _TEStandIn(name) for name in ("transformer_engine", "transformer_engine.pytorch",
                                                         "transformer_engine.common",
                                                         "transformer_engine.common.recipe")}
        stand_ins["transformer_engine"].__path__ = []
        stand_ins["transformer_engine"].pytorch = stand_ins["transformer_engine.pytorch"]
        sys.modules.update(stand_ins)
        try:
            self._loader.exec_module(module)
            for name in _BRIDGE_MODULES:
                importlib.import_module(name)
        finally:
            for name in stand_ins:
                sys.modules.pop(name, None)
        if mcore_te.HAVE_TE:
            raise RuntimeError("megatron-core saw the transformer_engine stand-in: the import order above changed")
        _local_specs()


def _local_specs() -> None:
    import megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model as qwen3_vl_model
    from megatron.bridge.models import gpt_provider
    from megatron.bridge.models.qwen_vl import qwen3_vl_provider
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer import transformer_block

    transformer_block.LayerNormImpl = CPUNorm
    gpt_provider.transformer_engine_layer_spec = cpu_gpt_layer_spec
    qwen3_vl_provider.get_gpt_layer_with_transformer_engine_spec = cpu_gpt_layer_spec
    qwen3_vl_model.get_vit_layer_with_transformer_engine_spec = _cpu_vit_layer_spec
    qwen3_vl_model.TENorm = CPUNorm
    qwen3_vl_model.TEColumnParallelLinear = ColumnParallelLinear
    qwen3_vl_model.TERowParallelLinear = RowParallelLinear


# ------------------------------------------------------------------------------------ verl
def torch_linear_cross_entropy(hidden, weight, labels, temperature=1.0, reduction="none", dist_process_group=None):
    """verl's fused ``linear_cross_entropy`` (Triton) in torch: the log-probs of ``labels`` and the entropy of
    ``hidden @ weight.T / temperature``, both reduced over the vocab-parallel group by verl's own functions.

    Shapes: ``hidden`` ``(..., h)``, ``weight`` ``(v / tp, h)``, ``labels`` ``(...)`` -> two ``(n,)`` tensors.
    """
    from verl.utils.megatron.tensor_parallel import (
        vocab_parallel_entropy,
        vocab_parallel_log_probs_from_logits,
    )

    if reduction != "none":
        raise ValueError(f"torch_linear_cross_entropy: reduction={reduction!r}; verl's engine uses 'none'")
    logits = hidden.reshape(-1, hidden.shape[-1]).float() @ weight.float().t() / temperature
    return vocab_parallel_log_probs_from_logits(logits, labels.reshape(-1)), vocab_parallel_entropy(logits)


def _fused_kernels() -> None:
    import verl.models.mcore.model_forward_fused as fused

    fused.linear_cross_entropy = torch_linear_cross_entropy


def _fresh_adam_state(optimizer) -> None:
    """torch Adam's per-parameter state as it is before a first step (``step`` 0, zero moments), for every
    parameter that has none yet: what a step from it does is unchanged."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if optimizer.state[param]:
                continue
            state = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(param), "exp_avg_sq": torch.zeros_like(param)}
            if group.get("amsgrad"):
                state["max_exp_avg_sq"] = torch.zeros_like(param)
            optimizer.state[param] = state


def _optimizer_state_before_a_step() -> None:
    from megatron.core.optimizer import distrib_optimizer

    cls = distrib_optimizer.DistributedOptimizer
    if getattr(cls.state_dict, "_cpu_harness", False) or distrib_optimizer.HAVE_APEX_OR_TE:
        return
    original = cls.state_dict

    def state_dict(self):
        if isinstance(self.optimizer, torch.optim.Adam | torch.optim.AdamW):
            _fresh_adam_state(self.optimizer)  # a resume loads into an optimizer that has not stepped yet
        return original(self)

    state_dict._cpu_harness = True
    cls.state_dict = state_dict
    # an fp32 model's optimizer shards are views of its parameters: a resume copies into them in place
    setter = cls._set_main_param_and_optimizer_states
    cls._set_main_param_and_optimizer_states = torch.no_grad()(setter)


def _float32_engine() -> None:
    from verl.workers.config.engine import McoreEngineConfig

    if getattr(McoreEngineConfig.__post_init__, "_cpu_harness", False):
        return
    original = McoreEngineConfig.__post_init__

    def __post_init__(self) -> None:
        if self.dtype != "float32":
            return original(self)
        object.__setattr__(self, "dtype", "bfloat16")  # verl's check, then the CPU dtype back
        try:
            original(self)
        finally:
            object.__setattr__(self, "dtype", "float32")

    __post_init__._cpu_harness = True
    McoreEngineConfig.__post_init__ = __post_init__


def _under_redirect(function):
    def run(*args, **kwargs):
        with cuda_redirect():
            return function(*args, **kwargs)

    run.__name__, run.__qualname__, run.__doc__ = function.__name__, function.__qualname__, function.__doc__
    run.__wrapped__ = function
    return run


def _cpu_engine(base):
    """verl's Megatron engine class with each public method run under :class:`cuda_redirect`."""
    methods = {name: _under_redirect(getattr(base, name)) for name in dir(base)
               if not name.startswith("_") and callable(getattr(base, name, None))
               and not isinstance(getattr(base, name), type)
               and not isinstance(base.__dict__.get(name), staticmethod | classmethod | property)}
    methods["__init__"] = _under_redirect(base.__init__)
    methods["__doc__"] = f"verl's {base.__name__} on the CPU harness (every public method under the CUDA redirect)."
    return type(f"CPU{base.__name__}", (base,), methods)


CPUMegatronEngineWithLMHead = CPUMegatronEngineWithValueHead = None


def _register_engines() -> None:
    global CPUMegatronEngineWithLMHead, CPUMegatronEngineWithValueHead
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.megatron.transformer_impl import (
        MegatronEngineWithLMHead,
        MegatronEngineWithValueHead,
    )

    CPUMegatronEngineWithLMHead = _cpu_engine(MegatronEngineWithLMHead)
    CPUMegatronEngineWithValueHead = _cpu_engine(MegatronEngineWithValueHead)
    for model_type, engine in (("language_model", CPUMegatronEngineWithLMHead),
                               ("value_model", CPUMegatronEngineWithValueHead)):
        EngineRegistry._engines.setdefault(model_type, {}).setdefault("megatron", {})["cpu"] = engine


def _megatron() -> None:
    """What megatron-core needs, right after ``megatron.core``'s package is first imported (before the module
    that imported it goes on), and the wrapper of Megatron-Bridge's first import (:class:`_BridgeImport`)."""
    global CPUDotProductAttention
    if "megatron.bridge" in sys.modules:
        raise RuntimeError("megatron.bridge is being imported before megatron.core: the Megatron CPU harness imports "
                           "it itself, with a transformer_engine stand-in; import megatron.core (or verl's "
                           "engines) first")
    _rng_tracker()
    CPUDotProductAttention = _make_attention()
    sys.meta_path.insert(0, _BridgeImport())
    _optimizer_state_before_a_step()


_INSTALLED = False


def install() -> None:
    """Every registration and patch (once per process); runs when ``import verl`` loads this module."""
    global _INSTALLED
    if _INSTALLED:
        return
    if os.environ.get("VERL_PLATFORM", "").strip().lower() != "cpu":
        raise RuntimeError(f"{__name__} is loaded (VERL_USE_EXTERNAL_MODULES) but VERL_PLATFORM="
                           f"{os.environ.get('VERL_PLATFORM')!r}: the Megatron CPU harness needs VERL_PLATFORM=cpu")
    if torch.cuda.is_available():
        raise RuntimeError(f"{__name__}: CUDA is available here; the Megatron CPU harness is for CPU-only machines")
    _torch_cuda_stand_ins()
    # the rest right after the module each patches is first imported: a Ray worker that never imports
    # megatron-core (storage units, reward workers) never imports Megatron-Bridge either
    after_import("megatron.core", _megatron, strict=True)
    after_import("verl.models.mcore.model_forward_fused", _fused_kernels, strict=True)
    after_import("verl.workers.config.engine", _float32_engine, strict=True)
    after_import("verl.workers.engine", _register_engines, strict=True)
    cuda_redirect().__enter__()  # the importing thread (a torchrun rank's main thread) keeps it on
    if _RECORD:
        import atexit

        atexit.register(_write_record)
    _INSTALLED = True


def _write_record() -> None:
    import json
    from pathlib import Path

    Path(f"{_RECORD}.{os.getpid()}").write_text(json.dumps(_SITES), encoding="utf-8")


install()

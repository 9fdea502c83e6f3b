"""What the Megatron CPU harness (:mod:`verl_mopd.testing.cpu.megatron`) replaces upstream: pure data.

Kept apart from the harness, which installs itself when imported, so that a test (or a reader) can check
every named upstream line against the installed packages without loading the harness:
``tests/testing/test_megatron_harness_on_cpu.py`` fails, by name, on a line that moved.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PATCHES", "REDIRECTED_CALL_SITES", "Patch"]


@dataclass(frozen=True)
class Patch:
    """One monkeypatch: ``target`` (``module:attribute``) replaced, because of ``upstream`` (``file:line``
    inside the installed packages), whose text contains ``expect``."""

    target: str
    upstream: str
    expect: str
    why: str


PATCHES: list[Patch] = [
    Patch("torch.cuda:current_device,set_device,synchronize,Stream,Event,stream,current_stream,get_rng_state,"
          "set_rng_state,manual_seed,memory_*", "megatron/core/tensor_parallel/random.py:306",
          "self.states_[name] = torch.cuda.get_rng_state()",
          "megatron-core calls torch.cuda directly, not verl's device module (sites: REDIRECTED_CALL_SITES)"),
    Patch("torch (TorchFunctionMode): device='cuda', Tensor.cuda(), Tensor.to('cuda'), Tensor.type()",
          "megatron/core/optimizer/clip_grads.py:108", "total_norm = torch.zeros(1, dtype=torch.float, device='cuda')",
          "megatron-core hard-codes device='cuda' and asserts CUDA tensor types (sites: REDIRECTED_CALL_SITES)"),
    Patch("megatron.core.tensor_parallel.random:_get_cuda_rng_state", "megatron/core/tensor_parallel/random.py:118",
          "return torch.cuda.random.get_rng_state(device=device)",
          "the RNG tracker's states are the CPU generator's"),
    Patch("megatron.core.tensor_parallel.random:_set_cuda_rng_state", "megatron/core/tensor_parallel/random.py:174",
          "_lazy_call(cb)", "the CUDA set is queued lazily and never runs on CPU: fork() would not fork"),
    Patch("megatron.core.transformer.transformer_block:LayerNormImpl",
          "megatron/core/transformer/transformer_block.py:64", "LayerNormImpl = WrappedTorchNorm",
          "a block built from a layer spec (Megatron-Bridge's providers) takes its final norm here; "
          "WrappedTorchNorm refuses sequence parallel"),
    Patch("megatron.bridge.models.gpt_provider:transformer_engine_layer_spec",
          "megatron/bridge/models/gpt_provider.py:125", "return transformer_engine_layer_spec(config)",
          "GPT providers' default layer spec is TE's"),
    Patch("megatron.bridge.models.qwen_vl.qwen3_vl_provider:get_gpt_layer_with_transformer_engine_spec",
          "megatron/bridge/models/qwen_vl/qwen3_vl_provider.py:148",
          "language_transformer_layer_spec = get_gpt_layer_with_transformer_engine_spec(",
          "Qwen3-VL's language model spec is TE's"),
    Patch("megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model:get_vit_layer_with_transformer_engine_spec",
          "megatron/bridge/models/qwen_vl/modelling_qwen3_vl/model.py:305",
          "vision_transformer_layer_spec = get_vit_layer_with_transformer_engine_spec()",
          "Qwen3-VL's vision tower spec is TE's"),
    Patch("megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model:TENorm,TEColumnParallelLinear,TERowParallelLinear",
          "megatron/bridge/models/qwen_vl/modelling_qwen3_vl/model.py:307", "patch_norm=TENorm,",
          "Qwen3-VL's patch merger is built from TE modules"),
    Patch("sys.modules['transformer_engine'] while megatron.bridge is imported",
          "megatron/bridge/models/gpt_full_te_layer_autocast_spec.py:28",
          "from transformer_engine.pytorch import TransformerLayer",
          "Megatron-Bridge imports transformer_engine.pytorch unconditionally"),
    Patch("verl.models.mcore.model_forward_fused:linear_cross_entropy", "verl/utils/kernel/kernels.py:577",
          "assert hidden.is_cuda", "verl's fused log-prob kernel is Triton, CUDA only"),
    Patch("megatron.core.optimizer.distrib_optimizer:DistributedOptimizer.state_dict",
          "megatron/core/optimizer/distrib_optimizer.py:839", "assert len(steps) == 1",
          "without Transformer Engine or Apex, a resume reads the step from torch Adam's state, which is empty "
          "before the first step: the state is filled as it is before a step"),
    Patch("megatron.core.optimizer.distrib_optimizer:DistributedOptimizer._set_main_param_and_optimizer_states",
          "megatron/core/optimizer/distrib_optimizer.py:1225", "dst_tensors[key].copy_(tensors[key])",
          "in fp32 the main parameters are views of the model's: a resume's in-place copy runs under no_grad"),
    Patch("verl.workers.config.engine:McoreEngineConfig.__post_init__", "verl/workers/config/engine.py:218",
          'assert self.dtype in ["bfloat16", "float16"]', "the CPU checks run the engine in float32"),
]

#: the CUDA calls the redirect answers (file -> lines; each line names ``cuda``), as recorded
#: (``VERL_MOPD_CPU_RECORD``) over the engine tests: train and infer, THD and BSHD, TP 1 and 2, the teacher.
#: A test fails on a call site not listed, and on a listed line that no longer names CUDA.
REDIRECTED_CALL_SITES: dict[str, tuple[int, ...]] = {
    "megatron/bridge/models/conversion/param_mapping.py": (1297, 1298),
    "megatron/bridge/models/model_provider.py": (689,),
    "megatron/bridge/models/qwen_vl/modelling_qwen3_vl/rope.py": (134,),
    "megatron/bridge/models/qwen_vl/modelling_qwen3_vl/utils.py": (90,),
    "megatron/core/distributed/param_and_grad_buffer.py": (632, 1180, 1186),
    "megatron/core/models/common/embeddings/rotary_pos_embedding.py": (305,),
    "megatron/core/optimizer/clip_grads.py": (108, 112, 174, 180),
    "megatron/core/optimizer/distrib_optimizer.py": (401, 466, 758),
    "megatron/core/optimizer/optimizer.py": (315, 698, 702),
    "megatron/core/pipeline_parallel/schedules.py": (749,),
    "megatron/core/tensor_parallel/layers.py": (305, 647, 1000, 1041, 1363, 1403),
    "megatron/core/tensor_parallel/mappings.py": (145, 185),
    "megatron/core/tensor_parallel/random.py": (303, 305, 306, 490),
    "megatron/core/utils.py": (715, 1332),
    "megatron/training/models/dist_utils.py": (304, 306, 366),
}

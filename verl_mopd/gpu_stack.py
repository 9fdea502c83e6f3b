"""The one supported GPU stack: Python 3.12, Linux x86_64 (glibc >= 2.34), CUDA 13 wheels.

Pure data and no imports: ``setup.py`` executes this file for its ``megatron`` and ``sglang``
extras, ``verl-mopd check`` compares what is installed with :data:`SUPPORTED`, and
``scripts/check_gpu_install.py`` proves with pip's resolver that the install below resolves, and with
a static import walk over the resolved wheels that what runs at run time is in it (:data:`RUNTIME_ROOTS`).

verl's own convention is its image plus ``pip install --no-deps`` on top (:data:`VERL_IMAGE` says what
of verl 0.9.1's image could be found, and what could not). The pip-only path is three commands,
because no single pip resolution exists (pip's own verdict):

1. ``pip install --prefer-binary -e ".[megatron,sglang]"``: everything that resolves together, as
   binary wheels except the pure-Python sdists in :data:`PURE_PYTHON_SDISTS` (no compiler needed).
2. ``pip install --no-deps sglang==0.5.12 megatron-bridge==0.6.2`` (:data:`NO_DEPS`): each
   declares a pin that contradicts verl 0.9.1 or the other (:data:`OVERRIDES`). Every other
   requirement of theirs is in step 1, which the resolver script checks requirement by requirement.
3. ``pip install --no-build-isolation --no-deps transformer-engine-torch==2.14.1 flash-attn==2.8.3``
   (:data:`SOURCE_BUILD`): Transformer Engine's PyTorch extension and FlashAttention 2 exist on PyPI
   only as source distributions; they compile against the installed torch and need ``nvcc`` (TE's
   binary core comes in step 1). flash-attn 2.8.3 is verl 0.9.1's own pin (its ``megatron`` extra) and
   the newest release inside Transformer Engine 2.14.1's window (2.1.1 <= flash-attn <= 2.8.3, TE's
   ``FlashAttentionUtils``): verl's Megatron engine sets ``attention_backend: flash``, and without it TE
   has no backend ("No dot product attention backend is available").

Why these versions: verl 0.9.1's ``sglang`` extra pins torch 2.11.0, transformers 5.9.0 and
sglang 0.5.12 (so verl itself runs sglang 0.5.12 on transformers 5.9.0, against sglang's own
``transformers==5.6.0``, a version verl excludes). Its ``megatron`` extra pins flash-attn 2.8.3,
cupy-cuda13x 14.0.1, nvidia-modelopt 0.44.0 and megatron-bridge 0.5.2; where this stack differs, and
why, is :data:`DEVIATIONS`. Megatron-Bridge 0.6.2 is the newest release; it
accepts transformers 5.9.0 (0.5.x needs < 5.9) and needs Megatron-Core >= 0.18 (THD packing);
Megatron-Core 0.19.2, because its 0.18.2 cannot build a *training* engine under Megatron-Bridge 0.6.2
(verl's DDP config imports ``megatron.training.models.gpt``, which ships from 0.19; forward-only
engines are not affected). The CPU test suite installs the same megatron-core and Megatron-Bridge and
trains through them (``tests/testing/test_megatron_engine_on_cpu.py``).
"""

PYTHON = "3.12"

#: the Megatron-Core release of the GPU stack and of the CPU test suite (setup.py's test extra)
MEGATRON_CORE = "0.19.2"
#: ModelOpt, as verl 0.9.1's own ``megatron`` extra pins it: Megatron-Bridge 0.6.2 imports it on every
#: Hugging Face weight save (``AutoBridge.save_hf_weights``), so the first checkpoint needs it
MODELOPT = "0.44.0"

#: installed with ``pip install --no-deps`` after the extras (step 2)
NO_DEPS = {"sglang": "0.5.12", "megatron-bridge": "0.6.2"}

#: FlashAttention 2, as verl 0.9.1's ``megatron`` extra pins it (``verl[flash-attn-cu130torch211]``); Transformer
#: Engine 2.14.1 uses it only inside ``FLASH_ATTN_WINDOW_TE``
FLASH_ATTN = "2.8.3"
#: Transformer Engine 2.14.1's accepted flash-attn versions (``transformer_engine/pytorch/attention/
#: dot_product_attention/utils.py``: ``FlashAttentionUtils.version_required`` .. ``max_version``; on Blackwell
#: the minimum is 2.7.3). A ``.postN`` of 2.8.3 compares above the maximum, so TE would ignore it. The resolver
#: script reads both bounds from TE's own source again and fails if they moved.
FLASH_ATTN_WINDOW_TE = (">=2.1.1,<=2.8.3", ">=2.7.3,<=2.8.3")  # (Hopper and older, Blackwell)
#: cupy, as verl 0.9.1's ``megatron`` extra pins it (``verl[cupy-cu130]``): verl's NCCL checkpoint engine
#: (``mopd_separate_async``, ``checkpoint_engine.backend: nccl``) imports it, and so does ``ray.util.collective``
CUPY = "14.0.1"

#: built from source after step 2 (step 3): ``pip install --no-build-isolation --no-deps <name>==<version> ...``
SOURCE_BUILD = {"transformer-engine-torch": "2.14.1", "flash-attn": FLASH_ATTN}

#: sdists of pure-Python packages that step 1 needs and PyPI has no wheel of (pip builds them without a
#: compiler; the resolver script builds them first so that its binary-only resolution can use them)
PURE_PYTHON_SDISTS = {"antlr4-python3-runtime": "4.9.3"}  # hydra-core 1.3's antlr4-python3-runtime==4.9.*

#: (package, requirement it declares) -> why this install does not meet it
OVERRIDES = {
    ("sglang", "transformers"): "verl 0.9.1 excludes transformers 5.6.0 and runs sglang 0.5.12 on 5.9.0 "
                                "(verl[sglang]'s own pins)",
    ("megatron-bridge", "flashinfer-python"): "sglang 0.5.12 needs 0.6.11.post1; megatron.bridge 0.6.2 never "
                                              "imports flashinfer",
    ("megatron-bridge", "flashinfer-cubin"): "as flashinfer-python",
    ("megatron-bridge", "megatron-core"): "megatron-core[mlm] 0.19.2 is installed, not its [dev] extra: Megatron-LM's "
                                          "development and training-loop tools (TensorStore, Energon, a source build "
                                          "of fast-hadamard-transform); of [dev], ModelOpt is installed (Megatron-Bridge "
                                          "imports it on every HF weight save)",
    ("megatron-bridge", "open-clip-torch"): "3.2+ needs timm >= 1.0.17 against sglang 0.5.12's timm==1.0.16; "
                                        "megatron.bridge 0.6.2 never imports open_clip",
    ("megatron-bridge", "fast-hadamard-transform"): "source-only on PyPI; megatron.bridge 0.6.2 never imports it",
    ("sglang", "flash-attn-4"): "verl 0.9.1 drops it too (its pyproject's override-dependencies; its sglang image "
                                "uninstalls it): it ships the same flash_attn/cute/ files as flash-attn 2.8.3, so "
                                "the two overwrite each other; SGLang imports it only for its non-default 'fa4' "
                                "attention backend (the import walk finds no unguarded import of flash_attn.cute)",
}

_TORCH = ["torch==2.11.0", "torchvision==0.26.0", "torchaudio==2.11.0"]

#: setup.py's GPU extras (step 1). No Python-version markers: on any Python but 3.12 pip refuses
#: loudly (megatron-core 0.18+ needs >= 3.12, verl 0.9.1 < 3.13) instead of installing half a stack.
EXTRAS = {
    # verl's Megatron engine (actor and backend: megatron teachers) and Megatron-Bridge's own
    # requirements (megatron-bridge itself comes in step 2)
    "megatron": [
        "verl[mcore]==0.9.1",
        *_TORCH,
        "megatron-core[mlm]==" + MEGATRON_CORE,
        "nvidia-modelopt==" + MODELOPT,
        "cupy-cuda13x==" + CUPY,
        "transformer-engine[core-cu13]==2.14.1",
        # what the Transformer Engine PyTorch extension (step 3) needs besides torch and its core
        "onnx",
        "onnxscript",
        "nvdlfw-inspect",
        "pydantic",
        "mistral-common>=1.11.0",
        "peft>=0.18.1",
        "datasets>=2.20.0",
        "accelerate",
        "diffusers>=0.36.0",
        "einops",
        "omegaconf>=2.3.0",
        "tensorboard>=2.19.0",
        "typing-extensions",
        "rich",
        "wandb==0.29.0",
        "six>=1.17.0",
        "regex>=2024.11.6",
        "pyyaml>=6.0.2",
        "tqdm>=4.67.1",
        "hydra-core>=1.3.4,<1.4",
        "qwen-vl-utils",
        "nvidia-resiliency-ext",
        "flash-linear-attention",
        "timm",
        "mlflow>=3.16.0",
        "comet-ml>=3.50.0",
    ],
    # verl[sglang] 0.9.1 without sglang, and sglang 0.5.12's own requirements (sglang comes in step 2)
    "sglang": [
        "verl[verl-core]==0.9.1",
        *_TORCH,
        "transformers==5.9.0",
        "mbridge",
        "IPython",
        "aiohttp",
        "apache-tvm-ffi==0.1.9",
        "anthropic>=0.20.0",
        "blobfile==3.0.0",
        "build",
        "compressed-tensors",
        "cuda-python>=13.0",
        "datasets",
        "einops",
        "fastapi",
        "flashinfer-python==0.6.11.post1",
        "flashinfer-cubin==0.6.11.post1",
        "gguf",
        "interegular",
        "llguidance>=0.7.11,<0.8.0",
        "modelscope",
        "msgspec",
        "ninja",
        "easydict",
        "numpy",
        "nvidia-cutlass-dsl==4.5.0",
        "nvidia-ml-py",
        "openai-harmony==0.0.4",
        "openai==2.6.1",
        "orjson",
        "outlines==0.1.11",
        "packaging",
        "partial-json-parser",
        "pillow",
        "prometheus-client>=0.20.0",
        "psutil",
        "py-spy",
        "pybase64",
        "pydantic",
        "python-multipart",
        "pyzmq>=25.1.2",
        "quack-kernels>=0.4.1",
        "requests",
        "scipy",
        "sentencepiece",
        "setproctitle",
        "sgl-deep-gemm==0.1.0",
        "sglang-kernel==0.4.2.post2",
        "soundfile==0.13.1",
        "tiktoken",
        "tilelang==0.1.8",
        "timm==1.0.16",
        "tokenspeed-mla==0.1.1",
        "torch-memory-saver>=0.0.9.post1",
        "torchao==0.17.0",
        "torchcodec==0.11.1",
        "tqdm",
        "mistral-common>=1.11.0",
        "uvicorn",
        "uvloop",
        "watchfiles",
        "xgrammar==0.2.0",
        "smg-grpc-servicer>=0.5.0",
        "kernels",
    ],
}

#: what ``verl-mopd check`` and the resolver script compare versions with (distribution -> specifier;
#: "" = any version). The GPU packages of verl 0.9.1's Megatron engine and SGLang rollout.
SUPPORTED = {
    "verl": "==0.9.1",
    "torch": "==2.11.0",
    "transformers": "==5.9.0",
    "TransferQueue": ">=0.1.10,<0.2",
    "hydra-core": ">=1.3,<1.4",
    "megatron-core": "==" + MEGATRON_CORE,
    "megatron-bridge": "==" + NO_DEPS["megatron-bridge"],
    "transformer-engine": "==2.14.1",
    "transformer-engine-cu13": "==2.14.1",
    "transformer-engine-torch": "==" + SOURCE_BUILD["transformer-engine-torch"],
    "sglang": "==" + NO_DEPS["sglang"],
    "sglang-kernel": "==0.4.2.post2",
    "flashinfer-python": "==0.6.11.post1",
    "mbridge": "",  # verl[mcore]; only for vanilla_mbridge=true
    "nvidia-modelopt": "==" + MODELOPT,
    "cupy-cuda13x": "==" + CUPY,
    "flash-attn": "==" + FLASH_ATTN,
}

#: verl 0.9.1's own image, as far as the sources reachable on 2026-12-07 show it. verl's convention is its image
#: plus ``pip install --no-deps -e .`` of what goes on top. What was found, and what was not:
VERL_IMAGE = {
    "tag": None,  # not found: no published tag names verl 0.9.1 (below); none is invented here
    "dockerfile": "docker/Dockerfile.uv.cu130 (named by verl 0.9.1's pyproject.toml; not in its wheel or sdist)",
    "build": "docker build -f docker/Dockerfile.uv.cu130 -t verl:uv-cu130 .  (in a verl checkout at the release), then "
             "`python3 manage_envs.py sync sglang megatron -- --frozen` inside it (verl's docker/README.md)",
    "contents": "nvidia/cuda:13.0.2-devel-ubuntu24.04, Python 3.12, torch 2.11.0+cu130 and the extras `sglang` and "
                "`megatron` from verl's uv.lock: flash-attn 2.8.3, apex, transformer-engine, megatron-bridge (verl's "
                "wheelhouse), megatron-core core_v0.18.0 (git), cupy-cuda13x 14.0.1, nvidia-modelopt 0.44.0, sglang "
                "0.5.12, no flash-attn-4",
    "not_found": "verl 0.9.1's git tag, uv.lock and docker/ files: the verl-project/verl mirror reachable here ends "
                 "at 1dda039 (2026-08-22, version 0.10.0.dev, tags up to v0.9.0) and its pyproject.toml differs from "
                 "0.9.1's (transformers 5.3.0/5.5.3 there, 5.9.0 in 0.9.1); its CI runs "
                 "verl-ci-cn-beijing.cr.volces.com/verlai/verl:uv.cu130 (a CI registry, a moving tag) and its "
                 "docker/README.md names verlai/verl:sgl0512.latest (a moving tag built by Dockerfile.stable.sglang, "
                 "which installs verl v0.7.1 and megatron-core core_v0.18.0). The lock at 1dda039 resolves "
                 "transformer-engine 2.16.1, flash-attn 2.8.3, megatron-bridge 0.5.2, megatron-core 0.18.0",
}

#: the pip-only path against verl 0.9.1's own ``megatron`` extra (and its image): distribution -> what differs, why
DEVIATIONS = {
    "megatron-bridge": "0.6.2 (verl: ==0.5.2 from its wheelhouse, deps-free): 0.5.x needs transformers < 5.9, and "
                       "verl 0.9.1 runs transformers 5.9.0; 0.6.2 has every bridge call verl makes with the same "
                       "signatures (gpu_audit_3, N1)",
    "megatron-core": MEGATRON_CORE + " (verl: unpinned, core_v0.18.0 from git in its lock): Megatron-Bridge 0.6.2 "
                     "needs >= 0.18, and 0.18.x cannot build a training engine under it",
    "transformer-engine": "2.14.1 from PyPI (verl: unpinned, from its wheelhouse, built against its torch; its lock "
                          "at 1dda039 has 2.16.1): PyPI's newest whose extension builds against torch 2.11; its "
                          "flash-attn window ends at 2.8.3, verl's pin",
    "flash-attn": FLASH_ATTN + " as verl pins it, compiled from PyPI's sdist in step 3 (verl: a prebuilt wheel from "
                  "its wheelhouse, which is not on PyPI and whose wheels follow its build matrix's torch)",
    "apex": "left out (verl: NVIDIA apex from git, prebuilt in its wheelhouse; PyPI's `apex` is another project): "
            "Megatron-Core and Transformer Engine import it only under try/except (the import walk finds no "
            "unguarded import on the run's path)",
    "nvidia-mathdx, trl, liger-kernel, matplotlib": "left out: the import walk of verl's Megatron engine, the "
            "bridge's save path, the checkpoint engines and SGLang reaches none of them (trl: verl's SFT/DPO "
            "trainers; liger-kernel: FSDP's use_liger; nvidia-mathdx: apex's build)",
    "flash-attn-4": "left out, as verl does (its override-dependencies): same flash_attn/cute/ files as flash-attn "
                    "2.8.3; SGLang's non-default fa4 backend only (OVERRIDES)",
}

#: wheels the import walk reads (``scripts/check_gpu_install.py``), at their resolved versions
WALKED = ["verl", "megatron-core", "megatron-bridge", "transformer-engine", "nvidia-modelopt", "sglang", "mbridge"]

#: the import walk's roots: module -> which function bodies run too (True: all, False: module level only,
#: a list: those ``Class.method`` bodies); imports are followed through every walked wheel at module level
RUNTIME_ROOTS = {
    # verl's Megatron engine (the stage-2 actor, the megatron teachers, the stage-1 SFT engine), with its lazy imports
    "verl.workers.engine.megatron.transformer_impl": True,
    "verl.workers.engine_workers": False,
    "verl.utils.megatron_utils": True,
    "verl.models.mcore.bridge": True,
    "megatron.core.models.gpt": False,
    "transformer_engine.pytorch": False,
    # Megatron-Bridge's save path (verl writes global_step_N/model/huggingface through it), load and export
    "verl.utils.checkpoint.megatron_checkpoint_manager": True,
    "megatron.bridge": False,
    "megatron.bridge.models.conversion.auto_bridge": ["AutoBridge.save_hf_weights", "AutoBridge.export_hf_weights",
                                                      "AutoBridge.from_hf_pretrained", "AutoBridge.load_hf_weights",
                                                      "AutoBridge.to_megatron_provider"],
    # verl's checkpoint engines: naive (mopd_sync, colocated) and nccl (mopd_separate_async)
    "verl.checkpoint_engine.base": True,
    "verl.checkpoint_engine.nccl_checkpoint_engine": True,
    # SGLang as verl runs it
    "verl.workers.rollout.sglang_rollout.async_sglang_server": True,
    "verl.workers.rollout.sglang_rollout.sglang_rollout": True,
    "sglang.srt.entrypoints.engine": False,
    "sglang.srt.entrypoints.http_server": False,
    "sglang.srt.managers.scheduler": False,
    "sglang.srt.managers.tokenizer_manager": False,
    "sglang.srt.managers.detokenizer_manager": False,
    "sglang.srt.model_executor.model_runner": False,
    "sglang.srt.models.qwen3_vl": False,
    # verl-mopd's own
    "verl_mopd.trainer.main": False,
    "verl_mopd.teachers.backends.megatron": True,
    "verl_mopd.teachers.group": True,
}

#: import name -> distribution, where they differ (the walk's map; the rest comes from the installed metadata)
IMPORT_NAMES = {
    "cupy": "cupy-cuda13x",
    "flash_attn": "flash-attn",
    "flash_attn_2_cuda": "flash-attn",
    "flash_attn_3": "flash-attn-3",
    "transformer_engine": "transformer-engine",
    "transformer_engine_torch": "transformer-engine-torch",
    "modelopt": "nvidia-modelopt",
    "sgl_kernel": "sglang-kernel",
    "flashinfer": "flashinfer-python",
    "deep_gemm": "sgl-deep-gemm",
    "compressed_tensors": "compressed-tensors",
    "partial_json_parser": "partial-json-parser",
    "IPython": "ipython",
    "zmq": "pyzmq",
    "yaml": "pyyaml",
    "PIL": "pillow",
    "cuda": "cuda-python",
    "transfer_queue": "TransferQueue",
    "nvidia_resiliency_ext": "nvidia-resiliency-ext",
    "pulp": "pulp",
    "sentencepiece": "sentencepiece",
}

#: imports the walk finds on the run's path that this install leaves out on purpose: import name (or a module
#: of a walked wheel) -> why it never runs here
NOT_ON_PATH = {
    "megatron.energon": "megatron-energon (Megatron-Core's [dev] extra, left out on the GPU; the CPU test extra has "
                        "it) is imported by megatron.bridge.training.checkpointing and .config, which verl reaches only "
                        "for LoRA adapters (MegatronCheckpointManager._maybe_filter_peft_state_dict, after its "
                        "`peft_cls is None` return), Megatron-FSDP's dtensor checkpoints (use_megatron_fsdp) and as a "
                        "fallback for Megatron-Bridge < 0.5; the recipes use none of them (tests/test_gpu_stack_on_cpu.py)",
    "megatron.core.dist_checkpointing.strategies.base": "verl's checkpoint.async_save path "
                        "(MegatronCheckpointManager._dispatch_finalize); Megatron-Core 0.19 has no such module; the "
                        "recipes keep async_save false, verl's default (tests/test_gpu_stack_on_cpu.py)",
    "sglang.srt.layers.moe.routed_experts_capturer": "verl's rollout routing replay for MoE models "
                        "(enable_rollout_routing_replay) only; SGLang 0.5.12 has no such module; the recipes' "
                        "students are dense and leave it off (tests/test_gpu_stack_on_cpu.py)",
}

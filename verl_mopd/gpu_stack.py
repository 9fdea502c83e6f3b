"""The one supported GPU stack: Python 3.12, Linux x86_64 (glibc >= 2.34), CUDA 13 wheels.

Pure data and no imports: ``setup.py`` executes this file for its ``megatron`` and ``sglang``
extras, ``verl-mopd check`` compares what is installed with :data:`SUPPORTED`, and
``scripts/check_gpu_install.py`` proves with pip's resolver that the install below resolves.

The install is three commands, because no single pip resolution exists (pip's own verdict):

1. ``pip install --prefer-binary -e ".[megatron,sglang]"``: everything that resolves together, as
   binary wheels except the pure-Python sdists in :data:`PURE_PYTHON_SDISTS` (no compiler needed).
2. ``pip install --no-deps sglang==0.5.12 megatron-bridge==0.6.2`` (:data:`NO_DEPS`): each
   declares a pin that contradicts verl 0.9.1 or the other (:data:`OVERRIDES`). Every other
   requirement of theirs is in step 1, which the resolver script checks requirement by requirement.
3. ``pip install --no-build-isolation --no-deps transformer-engine-torch==2.14.1`` (:data:`SOURCE_BUILD`):
   Transformer Engine's PyTorch extension exists only as a source distribution; it compiles
   against the installed torch and needs ``nvcc`` (its binary core comes in step 1).

Why these versions: verl 0.9.1's ``sglang`` extra pins torch 2.11.0, transformers 5.9.0 and
sglang 0.5.12 (so verl itself runs sglang 0.5.12 on transformers 5.9.0, against sglang's own
``transformers==5.6.0``, a version verl excludes). Megatron-Bridge 0.6.2 is the newest release; it
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

#: built from source after step 2 (step 3): ``pip install --no-build-isolation <name>==<version>``
SOURCE_BUILD = {"transformer-engine-torch": "2.14.1"}

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
        "flash-attn-4>=4.0.0b9",
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
}

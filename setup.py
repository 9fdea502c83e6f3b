"""verl-mopd: multi-teacher on-policy distillation (UI-MOPD) as a verl 0.9.1 plugin."""

import runpy
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
# pure data, no imports: read without importing the package (it imports verl)
GPU_STACK = runpy.run_path(str(HERE / "verl_mopd" / "gpu_stack.py"))
GPU_EXTRAS = GPU_STACK["EXTRAS"]

# A CPU machine: torch pinned so that pip takes the CPU wheel instead of resolving a multi-GB CUDA
# build through verl's dependencies (CUDA machines bring their own torch and skip these extras).
CPU_TORCH = ["torch==2.13.0"]
# `verl-mopd demo`: the CPU torch and the plot
DEMO = [*CPU_TORCH, "matplotlib"]
# `verl-mopd smoke` and the test suite run verl's real trainers on tiny Qwen3-VL models: Qwen3-VL's
# processor (its video processor) and qwen_vl_utils, which verl's datasets read images with, need
# torchvision, and no torchvision wheel on PyPI loads beside the CPU build of torch 2.13. So these
# take a matching pair, torch 2.14.1 with torchvision 0.29.1 (PyPI's builds, CUDA-enabled; they run
# on a CPU-only machine; the README's tour says how to take the CPU builds from PyTorch's own index).
VL_TORCH = ["torch==2.14.1", "torchvision==0.29.1", "qwen-vl-utils>=0.0.14,<0.1"]
# verl's Megatron engine on CPU (verl_mopd/testing/cpu/megatron.py), the smoke's default: the GPU stack's
# megatron-core (gpu_stack.py) and what Megatron-Bridge imports on CPU; Megatron-Bridge itself comes with
# --no-deps (its requirements contradict verl's: gpu_stack.NO_DEPS), as on the GPU
CPU_MEGATRON = [
    "megatron-core==" + GPU_STACK["MEGATRON_CORE"],
    "mbridge[megatron]>=0.15,<0.16",
    "megatron-energon>=7,<8",
    # Megatron-Bridge imports ModelOpt on every Hugging Face weight save (stage 1's checkpoint)
    "nvidia-modelopt==" + GPU_STACK["MODELOPT"],
]
# every command of the README's tour (demo, check, score, validate-recipe, smoke, inspect, the
# benchmark, the examples) on one CPU install, Python 3.12; then `pip install --no-deps
# megatron-bridge==0.6.2` (the README's tour and the smoke's missing-dependency error say both)
TOUR = [*VL_TORCH, "matplotlib", *CPU_MEGATRON]

setup(
    name="verl-mopd",
    version="0.1.0",
    description="Platform-routed multi-teacher on-policy distillation (UI-MOPD) for verl",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["verl_mopd", "verl_mopd.*"]),
    include_package_data=True,
    package_data={"verl_mopd": ["trainer/config/*.yaml", "py.typed"]},
    install_requires=[
        "verl>=0.9.1,<0.10",
        # verl 0.9.1's default (v1) trainer stores samples in TransferQueue (verl's verl-core extra)
        "TransferQueue>=0.1.10,<0.2",
        # imported by verl's v1 trainer / replay buffer (part of verl's verl-core extra)
        "cachetools",
        "fastapi",
        "uvicorn",
        "datasets",
        "pillow",
        "tqdm",
        "pyarrow>=19",
        "transformers>=5.5.3,<5.11,!=5.6.0",
        "numpy>=2.0",
        "rapidfuzz>=3.9,<4",  # bounded-time edit similarity in the reward (C, bit-parallel Levenshtein)
        # ray[default] (via TransferQueue) takes any virtualenv >= 20.0.24, but virtualenv >= 21.14.6
        # needs packaging >= 26.3 while pyvers (tensordict, via TransferQueue) caps packaging < 26:
        # without this bound pip downloads ~22 virtualenv releases before it finds one that fits
        "virtualenv>=20.26,<21.14.6",
    ],
    extras_require={
        "demo": DEMO,
        "tour": TOUR,
        # the CPU test suite: the tour's stack, the test tools, and what the tests drive for real
        "test": [
            *TOUR,
            "pytest>=8",
            "hypothesis>=6.100",
            # the online-eval harness tests: OSWorld's VM pins pyautogui 0.9.54 (its keyboard code runs
            # against a recorded X display); MobileWorld's BaseAgent needs openai and loguru
            "pyautogui==0.9.54",
            "openai>=1.40",
            "loguru>=0.7",
        ],
        # the GPU stack (Python 3.12, CUDA 13): verl_mopd/gpu_stack.py, the one place of its pins and of the
        # two further install steps no extra can express (README "GPU install")
        **GPU_EXTRAS,
    },
    entry_points={
        "console_scripts": ["verl-mopd=verl_mopd.cli:main"],
        # verl/__init__.py loads every entry point of this group in each process that imports verl.
        "verl.plugins": ["verl_mopd=verl_mopd._verl_plugin"],
    },
    classifiers=[
        "License :: OSI Approved :: Apache Software License",
        "Programming Language :: Python :: 3",
    ],
)

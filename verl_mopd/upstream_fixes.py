"""Corrections to upstream libraries that the recipes need, applied in every verl process by ``register()``.

Each fix runs right after its module's first import (``plugin.after_import``), so a process that never
imports the module pays nothing. Each names the upstream versions it was checked against, and does
nothing on any other (with a warning): an upstream release that fixes the bug itself must not be
corrected twice. ``VERL_MOPD_UPSTREAM_FIXES=none`` turns them all off (the tests use it to show the bug).

- :func:`qwen3_vl_deepstack_grads`: Megatron-Bridge's Qwen3-VL under tensor parallelism with sequence
  parallelism (verl's default, and the stage-2 student's layout at TP 2) gives the vision tower
  wrong gradients. ``split_deepstack_embs`` hands each TP rank the deepstack embeddings of its own
  sequence shard by plain indexing, so each rank back-propagates only its shard into the deepstack
  mergers and the vision tower, whose parameters are replicated across the TP ranks; nothing sums
  those partial gradients (the vision config has ``sequence_parallel=False``), so the ranks' copies
  drift apart (measured on CPU: the deepstack merger bias's gradient differs between the two ranks
  by 4.8e-2, the total grad norm is 3.8071 against 3.8183 at TP 1). The fix passes each deepstack
  embedding through megatron's ``copy_to_tensor_model_parallel_region`` before the split: identity
  forward, all-reduce over TP backward, which is what the language embeddings' own
  ``scatter_to_sequence_parallel_region`` does. Cost: one all-reduce over the TP group per deepstack
  layer and backward pass, of the image tokens' embeddings (``3 x n_image_tokens x hidden`` values
  for Qwen3-VL-8B's three deepstack layers).
- :func:`qwen3_vl_merger_gelu`: Megatron-Bridge builds Qwen3-VL's patch mergers (the final one and the
  deepstack ones) with the vision tower's ``gelu(approximate="tanh")``, where the Hugging Face model
  the checkpoints come from (and SGLang's, which samples the rollouts) uses the exact erf GELU
  (``nn.GELU()``). Measured on CPU, fp32: the log-probs of every sample with an image differ from
  transformers' by up to 1.5e-5 (2.5e-5 for a confident, warmed-up model), the text-only ones by
  3e-7; with the exact GELU, every sample is within 5e-7. The fix sets each merger's activation to
  the exact GELU after its ``__init__``. Cost: none measurable.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from importlib.metadata import PackageNotFoundError, version

__all__ = ["FIXES", "enabled", "qwen3_vl_deepstack_grads", "qwen3_vl_merger_gelu"]

logger = logging.getLogger("verl_mopd")

QWEN3_VL_MODEL = "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model"
#: Megatron-Bridge releases whose ``split_deepstack_embs`` has the bug (read and tested on CPU)
QWEN3_VL_DEEPSTACK_AFFECTED = ("0.6.2",)


def enabled() -> bool:
    return os.environ.get("VERL_MOPD_UPSTREAM_FIXES", "all").strip().lower() != "none"


def _applies(affected: tuple[str, ...], what: str) -> bool:
    """Whether a fix of ``what`` in the Megatron-Bridge releases ``affected`` applies here (a warning when
    another release is installed: it may have fixed the bug itself, and must not be corrected twice)."""
    if not enabled():
        return False
    try:
        installed = version("megatron-bridge")
    except PackageNotFoundError:
        return False
    if installed in affected:
        return True
    message = (f"verl-mopd: Megatron-Bridge {installed} is not one of {affected}, whose {what} it corrects; not "
               "applied. Run tests/testing/test_megatron_engine_on_cpu.py to see whether this release needs it")
    logger.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    return False


def qwen3_vl_deepstack_grads() -> bool:
    """Sum the deepstack embeddings' gradients over the TP group under sequence parallelism (see the module
    docstring). Returns whether the fix is in place."""
    import importlib

    if not _applies(QWEN3_VL_DEEPSTACK_AFFECTED, "Qwen3-VL vision gradients under TP + sequence parallel"):
        return False
    model = importlib.import_module(QWEN3_VL_MODEL)
    if getattr(model.split_deepstack_embs, "_verl_mopd_fix", False):
        return True
    from megatron.core.tensor_parallel import copy_to_tensor_model_parallel_region

    split = model.split_deepstack_embs

    @functools.wraps(split)
    def split_deepstack_embs(visual_pos_masks, deepstack_visual_embeds, tp_size=1, tp_rank=0, cp_size=1, cp_rank=0,
                             sequence_parallel=False):
        if sequence_parallel and tp_size > 1 and visual_pos_masks is not None:
            deepstack_visual_embeds = [copy_to_tensor_model_parallel_region(e) for e in deepstack_visual_embeds]
        return split(visual_pos_masks, deepstack_visual_embeds, tp_size=tp_size, tp_rank=tp_rank, cp_size=cp_size,
                     cp_rank=cp_rank, sequence_parallel=sequence_parallel)

    split_deepstack_embs._verl_mopd_fix = True
    model.split_deepstack_embs = split_deepstack_embs
    return True


QWEN3_VL_UTILS = "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.utils"
#: Megatron-Bridge releases whose Qwen3-VL patch mergers use the tanh GELU (read and tested on CPU)
QWEN3_VL_MERGER_GELU_AFFECTED = ("0.6.2",)


def qwen3_vl_merger_gelu() -> bool:
    """Qwen3-VL's patch mergers (the final one and the deepstack ones) compute the exact (erf) GELU, as the
    Hugging Face model the checkpoints come from does (``nn.GELU()``); Megatron-Bridge builds them with the
    vision tower's ``gelu(approximate="tanh")``. Returns whether the fix is in place."""
    import importlib

    if not _applies(QWEN3_VL_MERGER_GELU_AFFECTED, "Qwen3-VL patch mergers' GELU"):
        return False
    utils = importlib.import_module(QWEN3_VL_UTILS)
    merger = utils.Qwen3VLVisionPatchMerger
    if getattr(merger.__init__, "_verl_mopd_fix", False):
        return True
    import torch

    init = merger.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.activation_func = torch.nn.functional.gelu  # Hugging Face's nn.GELU(): erf, not tanh

    __init__._verl_mopd_fix = True
    merger.__init__ = __init__
    return True


#: module whose import a fix waits for -> the fix
FIXES = {QWEN3_VL_MODEL: qwen3_vl_deepstack_grads, QWEN3_VL_UTILS: qwen3_vl_merger_gelu}

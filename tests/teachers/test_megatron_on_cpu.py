"""The ``megatron`` teacher's configuration: verl's reference-model config with the teacher on top.

The teacher itself runs on verl's real Megatron engine in ``tests/testing/test_megatron_engine_on_cpu.py``
(the CPU harness of ``verl_mopd.testing.cpu.megatron``): built from the composed run config as here,
forward only, parameter offload, fused kernels, several micro-batches, its stored log-probs equal to
transformers' forward. This file checks the config it is built from, and ``verl-mopd check``'s report.
"""

import importlib.util
import os

import pytest
import torch
from _teacher_tiny import save_tiny_lm
from hydra import compose, initialize_config_dir

import verl_mopd
from verl_mopd.errors import ConfigError
from verl_mopd.teachers.config import TeacherConfig

CONFIG_DIR = os.path.join(os.path.dirname(verl_mopd.__file__), "trainer", "config")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("megatron_teacher") / "m", seed=5)


def run_config(tiny, *overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="mopd", overrides=[f"actor_rollout_ref.model.path={tiny}", *overrides])


def teacher(tiny, **kw):
    base = dict(model_path=tiny, backend="megatron", n_gpus_per_node=8, tensor_model_parallel_size=4,
                pipeline_model_parallel_size=2, placement="colocated", platform="desktop", micro_batch_tokens=3000)
    return TeacherConfig(**{**base, **kw})


def test_worker_config_is_verls_ref_config_with_the_teacher_on_top(tiny):
    from verl.workers.config import McoreEngineConfig
    from verl.workers.config.optimizer import OptimizerConfig

    from verl_mopd.teachers.backends.megatron import training_worker_config

    cfg = run_config(tiny, "actor_rollout_ref.actor.megatron.vanilla_mbridge=true",
                     "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full",
                     "actor_rollout_ref.actor.megatron.seed=7")
    twc = training_worker_config(teacher(tiny, weights="pageable"), cfg)
    eng = twc.engine_config
    assert isinstance(eng, McoreEngineConfig) and eng.strategy == "megatron"
    assert eng.forward_only and eng.param_offload and not eng.optimizer_offload
    assert (eng.tensor_model_parallel_size, eng.pipeline_model_parallel_size, eng.dtype) == (4, 2, "bfloat16")
    assert eng.use_dynamic_bsz and eng.infer_max_token_len_per_gpu == 3000 and eng.infer_micro_batch_size_per_gpu is None
    # inherited from the actor, as verl's ref inherits it (ref/megatron_ref.yaml)
    assert eng.vanilla_mbridge and eng.seed == 7 and eng.override_transformer_config["recompute_granularity"] == "full"
    assert eng.use_remove_padding == twc.model_config.use_remove_padding
    # a real optimizer config (verl's ref gets the same): F1, `optimizer_config=None` crashed the module build
    assert isinstance(twc.optimizer_config, OptimizerConfig)
    assert twc.model_config.path == tiny and not twc.model_config.mtp.enable
    assert not training_worker_config(teacher(tiny, placement="dedicated"), cfg).engine_config.param_offload
    # verl's (pageable) offload only for weights=pageable: pinned is the worker's HostWeights, resident none
    for weights in ("auto", "resident", "pinned"):
        assert not training_worker_config(teacher(tiny, weights=weights), cfg).engine_config.param_offload
    # the Ray actor gets plain blocks and converts them itself, as verl's worker converts its ref block
    from verl_mopd.teachers.backends.megatron import megatron_teacher_class, worker_config_from_blocks

    init = megatron_teacher_class(teacher(tiny, weights="pageable"), cfg)
    assert all(isinstance(init.kwargs[k], dict) for k in ("teacher", "ref", "model"))
    again = worker_config_from_blocks(TeacherConfig(**init.kwargs["teacher"]), init.kwargs["ref"], init.kwargs["model"])
    assert again.engine_config == eng and again.model_config.path == tiny
    with pytest.raises(ConfigError, match="dtype='float32'"):
        training_worker_config(teacher(tiny, dtype="float32"), cfg)
    with pytest.raises(ValueError, match="model_engine=megatron"):
        training_worker_config(teacher(tiny), run_config(tiny, "model_engine=dp"))


def test_stack_report_names_what_verls_engine_imports():
    from verl_mopd.teachers.backends.megatron import megatron_stack_report

    report = {name.split(" ")[0]: (ok, detail) for name, ok, detail in megatron_stack_report(vanilla_mbridge=False)}
    rows = {name: ok for name, (ok, _) in report.items()}
    assert rows["megatron-core"] == (importlib.util.find_spec("megatron") is not None
                                     and importlib.util.find_spec("megatron.core") is not None)
    bridge_installed = importlib.util.find_spec("megatron") is not None and \
        importlib.util.find_spec("megatron.bridge") is not None
    te_installed = importlib.util.find_spec("transformer_engine") is not None
    # Megatron-Bridge 0.6.2 imports Transformer Engine: installed without it (the CPU test stack), the
    # row fails and says why
    assert rows["Megatron-Bridge"] == (bridge_installed and te_installed)
    if bridge_installed and not te_installed:
        assert "transformer_engine" in report["Megatron-Bridge"][1]
    assert rows["CUDA"] == torch.cuda.is_available()
    vanilla = {name.split(",")[0]: ok for name, ok, _ in megatron_stack_report(vanilla_mbridge=True)}
    assert vanilla["mbridge"] == (importlib.util.find_spec("mbridge") is not None)

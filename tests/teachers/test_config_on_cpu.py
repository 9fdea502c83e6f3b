"""mopd.teachers config: field validation, up-front checks, server/megatron translation to verl's dataclasses."""

import pytest
from _teacher_tiny import save_tiny_lm

from verl_mopd.teachers.backends.server import build_verl_distillation_config, to_hydra_overrides
from verl_mopd.teachers.config import (
    TeacherConfig,
    TeacherConfigError,
    TeachersConfig,
    validate_before_load,
    validate_platforms,
    validate_pools,
    validate_tokenizers,
)


def _teachers(backend="hf", **kw):
    return TeachersConfig.from_mapping({"teachers": {
        "desktop": {"model_path": "/ckpt/d", "backend": backend, **kw},
        "mobile": {"model_path": "/ckpt/m", "backend": backend, **kw}}})


@pytest.mark.parametrize("field,value,match", [
    ("backend", "vllm", r"mopd.teachers.desktop.backend='vllm': allowed values are \['hf', 'megatron', 'server'\]"),
    ("placement", "shared", r"placement='shared': allowed values are \['dedicated', 'colocated'\]"),
    ("n_gpus_per_node", 0, r"n_gpus_per_node=0: must be an integer >= 1"),
    ("tensor_model_parallel_size", 2, r"backend=hf is data-parallel only"),
])
def test_bad_field_names_key_and_allowed_values(field, value, match):
    with pytest.raises(TeacherConfigError, match=match):
        TeacherConfig(model_path="/ckpt/d", platform="desktop", **{field: value})


def test_all_errors_collected_and_unknown_key_named():
    with pytest.raises(TeacherConfigError) as exc:
        TeachersConfig.from_mapping({"teachers": {"desktop": {"model_path": "", "backend": "x"},
                                                  "mobile": {"model_path": "/m", "tp": 2}}})
    text = str(exc.value)
    assert "desktop.model_path" in text and "desktop.backend='x'" in text and "mobile" in text and "'tp'" in text


def test_megatron_tp_must_divide_pool():
    with pytest.raises(TeacherConfigError, match="not divisible"):
        TeacherConfig(model_path="/m", backend="megatron", n_gpus_per_node=8, tensor_model_parallel_size=3)


def test_platforms_in_data_must_equal_teachers():
    assert validate_platforms(["desktop", "mobile"], ["mobile", "desktop"]) == []
    errs = validate_platforms(["desktop", "tablet"], ["desktop", "mobile"], "val")
    assert any("['tablet'] with no teacher" in e for e in errs) and any("['mobile'] have no samples" in e for e in errs)


class _Tok:
    def __init__(self, vocab):
        self._v = vocab

    def get_vocab(self):
        return dict(self._v)


def test_before_load_collects_temperature_tokenizer_pool_errors():
    t = _teachers(backend="megatron", n_gpus_per_node=8, dtype="bfloat16", placement="dedicated")
    with pytest.raises(TeacherConfigError) as exc:
        validate_before_load(
            t, data_platforms={"train": ["desktop", "mobile"]}, rollout_temperature=0.7,
            student_tokenizer=_Tok({"a": 0, "b": 1}),
            teacher_tokenizers={"desktop": _Tok({"a": 0, "b": 1}), "mobile": _Tok({"a": 1, "b": 0})},
            total_gpus=16, actor_gpus=8)
    text = str(exc.value)
    assert "temperature=0.7" in text
    assert "mobile: tokenizer vocabulary differs" in text and "desktop: tokenizer" not in text
    assert "actor 8 + dedicated teachers 16" in text
    assert validate_tokenizers(_Tok({"a": 0}), {"desktop": _Tok({"a": 0})}) == []
    colocated = _teachers(backend="megatron", n_gpus_per_node=8, placement="colocated")
    assert validate_pools(colocated, total_gpus=8, actor_gpus=8) == []


def test_server_block_builds_verl_distillation_config():
    t = _teachers(backend="server", n_gpus_per_node=8, tensor_model_parallel_size=4, inference={"name": "sglang"})
    d = build_verl_distillation_config(t)  # verl's own DistillationConfig checks the pool sum
    assert d.enabled and d.teacher_key == "platform"
    assert set(d.teacher_models) == {"desktop", "mobile"}
    for p in ("desktop", "mobile"):
        m = d.teacher_models[p]
        assert m.key == p and m.num_replicas == 2 and m.inference.tensor_model_parallel_size == 4
        assert m.inference.name == "sglang"
    assert d.n_gpus_per_node * d.nnodes == 16
    overrides = to_hydra_overrides(t)
    assert "distillation.teacher_key=platform" in overrides
    assert "+distillation.teacher_models.mobile.key=mobile" in overrides


def test_server_and_worker_backends_cannot_mix():
    with pytest.raises(TeacherConfigError, match="mixed"):
        TeachersConfig.from_mapping({"teachers": {"desktop": {"model_path": "/d", "backend": "server"},
                                                  "mobile": {"model_path": "/m", "backend": "hf"}}})


def test_megatron_backend_builds_verl_engine_config(tmp_path):
    from verl_mopd.teachers.backends.megatron import engine_config, training_worker_config

    path = save_tiny_lm(tmp_path / "t", seed=0)
    cfg = TeacherConfig(model_path=path, backend="megatron", n_gpus_per_node=8, tensor_model_parallel_size=4,
                        pipeline_model_parallel_size=2, placement="colocated", platform="desktop")
    eng = engine_config(cfg)
    assert eng.forward_only and eng.param_offload and eng.strategy == "megatron"
    assert (eng.tensor_model_parallel_size, eng.pipeline_model_parallel_size) == (4, 2)
    twc = training_worker_config(cfg)
    assert twc.model_type == "language_model" and twc.model_config.path == path
    with pytest.raises(TeacherConfigError, match="dtype='float32'"):
        engine_config(TeacherConfig(model_path=path, backend="megatron", dtype="float32", platform="desktop"))

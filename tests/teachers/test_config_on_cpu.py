"""mopd.teachers config: field validation, up-front checks, server/megatron translation to verl's dataclasses."""

import pytest

from verl_mopd.teachers.backends.server import build_verl_distillation_config, to_hydra_overrides
from verl_mopd.errors import ConfigError
from verl_mopd.teachers.config import (
    TeacherConfig,
    validate_platforms,
    validate_temperature,
    validate_tokenizers,
)
from verl_mopd.config import MOPDConfig


def _teachers(backend="hf", **kw):
    return MOPDConfig.from_mapping({"teachers": {
        "desktop": {"model_path": "/ckpt/d", "backend": backend, **kw},
        "mobile": {"model_path": "/ckpt/m", "backend": backend, **kw}}})


@pytest.mark.parametrize("field,value,match", [
    ("backend", "vllm", r"mopd.teachers.desktop.backend='vllm': allowed values are \['hf', 'megatron', 'server'\]"),
    ("placement", "shared", r"placement='shared': allowed values are \['dedicated', 'colocated'\]"),
    ("n_gpus_per_node", 0, r"n_gpus_per_node=0: must be an integer >= 1"),
    ("tensor_model_parallel_size", 2, r"backend=hf is data-parallel only"),
])
def test_bad_field_names_key_and_allowed_values(field, value, match):
    with pytest.raises(ConfigError, match=match):
        TeacherConfig(model_path="/ckpt/d", platform="desktop", **{field: value})


def test_all_errors_collected_and_unknown_key_named():
    with pytest.raises(ConfigError) as exc:
        MOPDConfig.from_mapping({"teachers": {"desktop": {"model_path": "", "backend": "x"},
                                                  "mobile": {"model_path": "/m", "tp": 2}}})
    text = str(exc.value)
    assert "desktop.model_path" in text and "desktop.backend='x'" in text and "mobile" in text and "'tp'" in text


def test_megatron_tp_must_divide_pool():
    with pytest.raises(ConfigError, match="not divisible"):
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


def test_temperature_and_tokenizer_checks():
    assert validate_temperature(0.7) and "temperature=0.7" in validate_temperature(0.7)[0]
    assert validate_temperature(1.0) == []
    errors = validate_tokenizers(_Tok({"a": 0, "b": 1}), {"desktop": _Tok({"a": 0, "b": 1}), "mobile": _Tok({"a": 1, "b": 0})})
    assert any("mobile: tokenizer vocabulary differs" in e for e in errors) and not any("desktop" in e for e in errors)
    assert validate_tokenizers(_Tok({"a": 0}), {"desktop": _Tok({"a": 0})}) == []


def test_server_block_builds_verl_distillation_config():
    t = _teachers(backend="server", n_gpus_per_node=8, tensor_model_parallel_size=4, inference={"name": "sglang"})
    rollout = {"name": "vllm", "prompt_length": 1024, "response_length": 256, "temperature": 1.0}
    d = build_verl_distillation_config(t, rollout=rollout)  # verl's own DistillationConfig checks the pool sum
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
    with pytest.raises(ConfigError, match="mixed"):
        MOPDConfig.from_mapping({"teachers": {"desktop": {"model_path": "/d", "backend": "server"},
                                                  "mobile": {"model_path": "/m", "backend": "hf"}}})


def test_server_teachers_keep_verls_teacher_inference_defaults():
    """verl drops its default `teacher_model` entry (and its inference block) when several teachers are
    given; each of ours starts from that block, so the rollout name, lengths and temperature follow
    actor_rollout_ref.rollout and the engine defaults (eager, cache freeing, memory share) are kept."""
    import os

    from hydra import compose, initialize_config_dir

    import verl_mopd

    t = _teachers(backend="server", n_gpus_per_node=8, tensor_model_parallel_size=4)
    overrides = to_hydra_overrides(t)
    assert "+distillation.teacher_models.desktop.inference.name=${oc.select:actor_rollout_ref.rollout.name}" \
        in overrides
    config_dir = os.path.join(os.path.dirname(verl_mopd.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="mopd", overrides=[
            "actor_rollout_ref.model.path=/tmp/x", "actor_rollout_ref.rollout.name=sglang",
            "actor_rollout_ref.rollout.prompt_length=3000", "actor_rollout_ref.rollout.response_length=700",
            *overrides, "distillation.distillation_loss.loss_mode=k3"])
    from verl.utils.config import omega_conf_to_dataclass

    d = omega_conf_to_dataclass(cfg.distillation)  # what verl's v1 trainer does
    for p in ("desktop", "mobile"):
        inf = d.teacher_models[p].inference
        # verl turns the rollout's lengths into a prefill of prompt + response (3000 + 700) tokens
        assert (inf.name, inf.prompt_length, inf.response_length) == ("sglang", 3700, 1)
        assert inf.enforce_eager and inf.free_cache_engine and inf.skip_tokenizer_init
        assert inf.gpu_memory_utilization == 0.5 and inf.tensor_model_parallel_size == 4
    built = build_verl_distillation_config(t, rollout=cfg.actor_rollout_ref.rollout)
    assert built.teacher_models["mobile"].inference.prompt_length == 3700

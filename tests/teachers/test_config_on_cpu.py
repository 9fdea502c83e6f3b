"""mopd.teachers config: field validation, up-front checks; verl's teacher loop read from its own block."""

import pytest

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
    ("backend", "vllm", r"mopd.teachers.desktop.backend='vllm': allowed values are \['hf', 'megatron'\]"),
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


def test_server_backend_is_refused_with_the_place_to_declare_it():
    """Server teachers are declared once, in verl's own block; the old spelling says where."""
    with pytest.raises(ConfigError, match=r"mopd.teachers.desktop.backend='server': inference-server teachers are "
                                          r"declared once, in verl's distillation.teacher_models"):
        _teachers(backend="server")
    with pytest.raises(ConfigError, match=r"mopd.teachers.desktop.inference: removed; .*distillation.teacher_models"):
        MOPDConfig.from_mapping({"teachers": {"desktop": {"model_path": "/d", "inference": {"name": "sglang"}}}})


def _verl_distillation(entries: dict[str, dict], enabled: bool = True):
    """verl-mopd's defaults composed with ``entries`` as ``distillation.teacher_models`` (each with
    verl's default teacher inference block, one 1-GPU replica)."""
    import os

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import verl_mopd

    config_dir = os.path.join(os.path.dirname(verl_mopd.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="mopd", overrides=["actor_rollout_ref.model.path=/tmp/x",
                                                     f"distillation.enabled={str(enabled).lower()}",
                                                     "distillation.n_gpus_per_node=1"])
    inference = OmegaConf.to_container(cfg.distillation.teacher_models.teacher_model.inference, resolve=False)
    inference.update(tensor_model_parallel_size=1, data_parallel_size=1, pipeline_model_parallel_size=1)
    for name, entry in entries.items():
        OmegaConf.update(cfg, f"distillation.teacher_models.{name}", {"inference": inference, "num_replicas": 1,
                                                                      **entry}, force_add=True)
    cfg.distillation.nnodes = max(1, len([n for n in entries if n != "teacher_model"]))
    return cfg


@pytest.mark.parametrize("entries", [
    {"teacher_model": {"model_path": "/t"}},  # verl's single teacher: every sample, key "default"
    {"a": {"key": "desktop", "model_path": "/d"}, "b": {"key": "mobile", "model_path": "/m"}},
    {"teacher_model": {"model_path": "/dropped"}, "x": {"key": "web", "model_path": "/w"},
     "y": {"key": "desktop", "model_path": "/d"}, "z": {"key": "mobile", "model_path": "/m"}},
], ids=["single", "two", "three and verl's default entry"])
def test_loop_teachers_are_the_ones_verl_resolves(entries):
    """verl_loop reads the raw block; verl's own DistillationConfig (what its trainer builds) is the reference."""
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    from verl_mopd.teachers.verl_loop import loop_teachers

    cfg = _verl_distillation(entries)
    ours = loop_teachers(OmegaConf.to_container(cfg.distillation, resolve=True))
    verl = omega_conf_to_dataclass(cfg.distillation).teacher_models
    assert {k: t.model_path for k, t in ours.items()} == {k: t.model_path for k, t in verl.items()}
    for key, t in ours.items():
        assert cfg.distillation.teacher_models[t.name].model_path == t.model_path
        assert t.model_path_key == f"distillation.teacher_models.{t.name}.model_path"


def test_no_loop_teachers_when_verls_loop_is_off():
    from omegaconf import OmegaConf

    from verl_mopd.teachers.verl_loop import loop_teachers

    cfg = _verl_distillation({"a": {"key": "desktop", "model_path": "/d"}}, enabled=False)
    assert loop_teachers(OmegaConf.to_container(cfg.distillation, resolve=True)) == {}
    assert loop_teachers(None) == {}


def test_platform_errors_name_the_routing_key_in_use():
    """mopd.routing_key=domain: the errors say `domain`, not "platform" (validation and the router alike)."""
    from verl_mopd.teachers.router import UnknownRouteError, split

    errs = validate_platforms(["arithmetic", "sorting"], ["arithmetic", "poetry"], "train", routing_key="domain")
    assert errs == ["train data has domain value(s) ['sorting'] with no teacher; configured: ['arithmetic', 'poetry']",
                    ("teacher(s) ['poetry'] have no samples in the train data (domain values there: "
                     "['arithmetic', 'sorting'])")]
    assert not any("platform" in e for e in errs)
    with pytest.raises(UnknownRouteError) as err:
        split(["arithmetic", "sorting"], known=["arithmetic"], field="domain")
    assert "platform" not in str(err.value) and str(err.value).startswith("domain value(s) ['sorting'] have no teacher")

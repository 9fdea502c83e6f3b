"""The ``mopd.teachers`` block and the checks that run before any teacher model is loaded.

One entry per platform (the platform tag is the key)::

    mopd:
      routing_key: platform           # top-level dataset column
      teachers:
        desktop: {model_path: /ckpt/desktop_sft, backend: megatron, n_gpus_per_node: 8, nnodes: 1,
                  tensor_model_parallel_size: 8, placement: colocated}
        mobile:  {model_path: /ckpt/mobile_sft,  backend: megatron, n_gpus_per_node: 8, nnodes: 1,
                  tensor_model_parallel_size: 8, placement: colocated}

These are the teachers that run as verl worker groups (``hf``, ``megatron``) and are routed by
``verl_mopd.teachers.group``. Inference-server teachers are verl's own: they are declared once, in
verl's ``distillation.teacher_models`` (``verl_mopd.teachers.verl_loop`` reads them for validation).

Dataclasses follow verl's ``BaseConfig`` (``verl/base_config.py``) and are built from OmegaConf
with ``verl.utils.config.omega_conf_to_dataclass``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from verl.base_config import BaseConfig

from verl_mopd.errors import ConfigError

__all__ = [
    "BACKENDS",
    "PLACEMENTS",
    "WEIGHT_POLICIES",
    "DTYPES",
    "TeacherConfig",
    "build_teachers",
    "validate_platforms",
    "validate_temperature",
    "validate_tokenizers",
    "validate_model_configs",
    "compare_with_student",
]

BACKENDS = ("hf", "megatron")
PLACEMENTS = ("dedicated", "colocated")
#: where a teacher's weights live between steps (``verl_mopd.teachers.placement``)
WEIGHT_POLICIES = ("auto", "resident", "pinned", "pageable")
DTYPES = ("float32", "bfloat16", "float16")
#: the hint for the removed ``backend: server`` (and its ``inference`` block)
SERVER_TEACHERS_LIVE_IN_VERL = (
    "inference-server teachers are declared once, in verl's distillation.teacher_models.<name> "
    "(key: <routing value>, model_path, num_replicas, inference) with distillation.enabled=true and "
    "distillation.teacher_key=${mopd.routing_key}; remove them from mopd.teachers "
    "(examples/multi_domain_text/recipe.yaml shows the block)"
)


def _raise_if(errors: list[str]) -> None:
    if errors:
        raise ConfigError(errors, "mopd.teachers config")


@dataclass
class TeacherConfig(BaseConfig):
    """One platform's teacher (``mopd.teachers.<platform>``).

    model_path (str): HF checkpoint directory (or hub id) of the teacher.
    backend (str): ``hf`` (transformers forward in a verl worker, CPU or GPU) or ``megatron``
        (forward-only on verl's Megatron engine, GPU). Inference-server teachers are not declared
        here but in verl's ``distillation.teacher_models`` (module docstring).
    n_gpus_per_node (int): devices per node of this teacher's pool (``hf`` on CPU: processes).
    nnodes (int): nodes of this teacher's pool.
    tensor_model_parallel_size / pipeline_model_parallel_size (int): Megatron TP and PP; the data-parallel size is ``world_size / (tp * pp)``.
    placement (str): ``dedicated``: an own resource pool, teachers run concurrently; ``colocated``:
        shares the actor's pool; colocated teachers run together when their memory fits, else in turn
        (``verl_mopd.teachers.placement``).
    weights (str): a colocated teacher's weights between steps: ``resident`` (on the GPUs),
        ``pinned`` (a pinned host buffer reused every step), ``pageable`` (verl's forward-only offload,
        fresh pageable memory every step) or ``auto`` (``resident`` when it fits, else ``pinned``).
    params_b (float | None): parameter count in billions, for the memory plan when ``model_path`` is
        not a local folder (a local checkpoint's ``config.json`` gives it).
    micro_batch_tokens (int): token budget of one teacher forward micro-batch (``hf``/``megatron``).
    dtype (str): teacher parameter dtype.
    device (str): ``hf`` only: ``cpu`` or ``cuda``.
    trust_remote_code (bool): passed to ``from_pretrained``.
    """

    model_path: str = ""
    backend: str = "hf"
    n_gpus_per_node: int = 1
    nnodes: int = 1
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    placement: str = "dedicated"
    weights: str = "auto"
    params_b: float | None = None
    micro_batch_tokens: int = 16384
    dtype: str = "bfloat16"
    device: str = "cuda"
    trust_remote_code: bool = False
    # the platform this entry serves; filled from the block key by ``build_teachers``
    platform: str = ""

    def __post_init__(self):
        where = f"mopd.teachers.{self.platform or '<platform>'}"
        errors = []
        if not isinstance(self.model_path, str) or not self.model_path:
            errors.append(f"{where}.model_path={self.model_path!r}: must be a checkpoint path or hub id")
        if self.backend == "server":
            errors.append(f"{where}.backend='server': {SERVER_TEACHERS_LIVE_IN_VERL}")
        elif self.backend not in BACKENDS:
            errors.append(f"{where}.backend={self.backend!r}: allowed values are {list(BACKENDS)}")
        if self.placement not in PLACEMENTS:
            errors.append(f"{where}.placement={self.placement!r}: allowed values are {list(PLACEMENTS)}")
        if self.weights not in WEIGHT_POLICIES:
            errors.append(f"{where}.weights={self.weights!r}: allowed values are {list(WEIGHT_POLICIES)}")
        if self.params_b is not None and (isinstance(self.params_b, bool) or not isinstance(self.params_b, int | float)
                                          or not self.params_b > 0):
            errors.append(f"{where}.params_b={self.params_b!r}: must be a number of billions of parameters > 0")
        if self.dtype not in DTYPES:
            errors.append(f"{where}.dtype={self.dtype!r}: allowed values are {list(DTYPES)}")
        for key in ("n_gpus_per_node", "nnodes", "tensor_model_parallel_size", "pipeline_model_parallel_size",
                    "micro_batch_tokens"):
            val = getattr(self, key)
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                errors.append(f"{where}.{key}={val!r}: must be an integer >= 1")
        if not errors:
            mp = self.tensor_model_parallel_size * self.pipeline_model_parallel_size
            if self.world_size % mp:
                errors.append(
                    f"{where}: world_size n_gpus_per_node*nnodes={self.world_size} is not divisible by "
                    f"tensor_model_parallel_size*pipeline_model_parallel_size={mp}"
                )
        if self.backend == "hf":
            if self.device not in ("cpu", "cuda"):
                errors.append(f"{where}.device={self.device!r}: allowed values are ['cpu', 'cuda']")
            if self.tensor_model_parallel_size != 1 or self.pipeline_model_parallel_size != 1:
                errors.append(
                    f"{where}: backend=hf is data-parallel only (tensor/pipeline_model_parallel_size must be 1); "
                    "use backend=megatron for TP/PP"
                )
        _raise_if(errors)

    @property
    def world_size(self) -> int:
        return self.n_gpus_per_node * self.nnodes

    @property
    def model_path_key(self) -> str:
        """The config key of ``model_path``, as errors name it."""
        return f"mopd.teachers.{self.platform}.model_path"

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // (self.tensor_model_parallel_size * self.pipeline_model_parallel_size)


def build_teachers(block: Mapping[str, Any]) -> tuple[dict[str, TeacherConfig], list[str]]:
    """``mopd.teachers`` as ``{platform: TeacherConfig}``, and every problem found (one line each).

    Called by ``verl_mopd.config.MOPDConfig``, which owns the ``mopd`` block.
    """
    errors, built = [], {}
    for platform, cfg in dict(block).items():
        try:
            built[str(platform)] = _build_teacher(str(platform), cfg)
        except ConfigError as exc:
            errors.extend(exc.errors)
        except TypeError as exc:  # unknown key in the block
            errors.append(f"mopd.teachers.{platform}: {exc}")
    return built, errors


def _build_teacher(platform: str, cfg: Any) -> TeacherConfig:
    if isinstance(cfg, TeacherConfig):
        return cfg if cfg.platform == platform else TeacherConfig(**{**_fields(cfg), "platform": platform})
    if not isinstance(cfg, Mapping):
        raise ConfigError([f"mopd.teachers.{platform}={cfg!r}: must be a mapping of teacher keys"], "mopd.teachers config")
    cfg = {k: v for k, v in dict(cfg).items() if k != "_target_"}
    if "inference" in cfg:
        raise ConfigError([f"mopd.teachers.{platform}.inference: removed; {SERVER_TEACHERS_LIVE_IN_VERL}"],
                          "mopd.teachers config")
    return TeacherConfig(**{**cfg, "platform": platform})


def _fields(cfg: TeacherConfig) -> dict:
    from dataclasses import fields

    return {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name != "_target_"}


# ----------------------------------------------------------------------------------------------
# up-front validation: each runs on the driver before any teacher model is loaded
# ----------------------------------------------------------------------------------------------


def validate_platforms(data_platforms: Iterable[str], teachers: Iterable[str], split_name: str = "train",
                       routing_key: str = "platform") -> list[str]:
    """The platforms present in a data split must equal the configured teachers.

    Returns the error lines (empty when they agree), naming the routing column ``routing_key``
    (``mopd.routing_key``): a platform without a teacher would fail mid-run; a teacher without data
    is a config mistake (wrong file or tag spelling).
    """
    data, conf = {str(p) for p in data_platforms}, {str(t) for t in teachers}
    errors = []
    if data - conf:
        errors.append(
            f"{split_name} data has {routing_key} value(s) {sorted(data - conf)} with no teacher; configured: "
            f"{sorted(conf)}"
        )
    if conf - data:
        errors.append(
            f"teacher(s) {sorted(conf - data)} have no samples in the {split_name} data ({routing_key} values there: "
            f"{sorted(data)})"
        )
    return errors


def validate_temperature(temperature: float) -> list[str]:
    """``rollout.temperature`` must be 1.0: the student's log-probs are of the tempered
    distribution, the teacher's are not, so K3 would compare different distributions."""
    if float(temperature) != 1.0:
        return [
            f"actor_rollout_ref.rollout.temperature={temperature}: must be 1.0 for on-policy distillation "
            "(the KL would compare a tempered student with an untempered teacher)"
        ]
    return []


def _vocab(tok) -> dict[str, int]:
    return dict(tok.get_vocab())


#: tokenizer attributes whose ids must agree (besides the vocabulary)
SPECIAL_TOKEN_ATTRS = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")
#: ``config.json`` token ids a vision-language model matches in ``input_ids`` (Qwen-VL names)
CONFIG_TOKEN_FIELDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
#: ``config.json`` ``vision_config`` fields that fix how the student's processor cut ``pixel_values``
VISION_FIELDS = ("patch_size", "spatial_merge_size", "temporal_patch_size")


def _special_ids(tok) -> dict[str, Any]:
    ids = {attr: getattr(tok, attr, None) for attr in SPECIAL_TOKEN_ATTRS}
    ids["special tokens"] = sorted((str(t), int(tok.convert_tokens_to_ids(t)))
                                   for t in getattr(tok, "all_special_tokens", ()))
    return ids


def _paths(platform: str, student_path: str | None, teacher_paths: Mapping[str, str] | None) -> str:
    if student_path is None or not teacher_paths or platform not in teacher_paths:
        return ""
    return f" (teacher {teacher_paths[platform]}, student {student_path})"


def validate_tokenizers(student_tokenizer, teacher_tokenizers: Mapping[str, Any], *, student_path: str | None = None,
                        teacher_paths: Mapping[str, str] | None = None) -> list[str]:
    """Teachers score the student's token ids, so each teacher's token -> id map must equal the
    student's (same tokens at the same ids, added tokens included), and so must the special-token
    ids (``bos``/``eos``/``pad``/``unk`` and every special token). Paths, when given, are named in
    the errors.

    ``teacher_tokenizers`` (and ``teacher_paths``) are keyed by the name the errors give each teacher
    (:func:`compare_with_student` uses its config key, e.g. ``mopd.teachers.desktop``)."""
    errors = []
    ref, ref_special = _vocab(student_tokenizer), _special_ids(student_tokenizer)
    for platform, tok in teacher_tokenizers.items():
        where = _paths(platform, student_path, teacher_paths)
        other = _vocab(tok)
        if other != ref:
            differ = sorted(t for t in set(ref) | set(other) if ref.get(t) != other.get(t))
            errors.append(
                f"{platform}: tokenizer vocabulary differs from the student's{where}: "
                f"{len(differ)} token(s) differ, e.g. "
                + ", ".join(f"{t!r}: teacher {other.get(t)} vs student {ref.get(t)}" for t in differ[:3])
                + f"; sizes {len(other)} vs {len(ref)}. Teachers must share the student's tokenizer"
            )
            continue
        special = _special_ids(tok)
        for key in ref_special:
            if special[key] != ref_special[key]:
                errors.append(f"{platform}: tokenizer {key} differs from the student's{where}: "
                              f"teacher {special[key]!r} vs student {ref_special[key]!r}")
    return errors


def _config_value(config, field_name: str):
    value = getattr(config, field_name, None)
    if value is None and getattr(config, "text_config", None) is not None:
        value = getattr(config.text_config, field_name, None)
    return value


def validate_model_configs(student_config, teacher_configs: Mapping[str, Any], *, student_path: str | None = None,
                           teacher_paths: Mapping[str, str] | None = None) -> list[str]:
    """The teacher reads the student's ``input_ids`` (with the image tokens already expanded) and
    the student processor's ``pixel_values`` / ``image_grid_thw``: the image/video token ids and
    the vision tower's ``patch_size``, ``spatial_merge_size`` and ``temporal_patch_size`` must be
    the student's (transformers ``PretrainedConfig`` objects, or anything with those attributes).
    ``teacher_configs`` is keyed as :func:`validate_tokenizers`' teachers are."""
    errors = []
    for platform, cfg in teacher_configs.items():
        where = _paths(platform, student_path, teacher_paths)
        for name in CONFIG_TOKEN_FIELDS:
            t, s = _config_value(cfg, name), _config_value(student_config, name)
            if t != s:
                errors.append(f"{platform}: config {name} differs from the student's{where}: "
                              f"teacher {t!r} vs student {s!r}")
        t_vis, s_vis = getattr(cfg, "vision_config", None), getattr(student_config, "vision_config", None)
        if (t_vis is None) != (s_vis is None):
            errors.append(f"{platform}: the {'student' if t_vis is None else 'teacher'} has a vision "
                          f"tower (vision_config) and the {'teacher' if t_vis is None else 'student'} has none{where}")
            continue
        for name in VISION_FIELDS if t_vis is not None else ():
            t, s = getattr(t_vis, name, None), getattr(s_vis, name, None)
            if t != s:
                errors.append(f"{platform}: config vision_config.{name} differs from the student's"
                              f"{where}: teacher {t!r} vs student {s!r}")
    return errors


def compare_with_student(teachers: Mapping[str, Any], student_path: str, *, student_tokenizer_path: str | None = None,
                         trust_remote_code: bool = False) -> list[str]:
    """Load the tokenizers and ``config.json`` of the student and of each teacher (no weights) and
    run :func:`validate_tokenizers` and :func:`validate_model_configs`; returns the error lines.

    Args:
        teachers: ``{platform: teacher}`` to compare, each a :class:`TeacherConfig` or a
            ``verl_mopd.teachers.verl_loop.LoopTeacher`` (anything with ``model_path``,
            ``trust_remote_code`` and ``model_path_key``, the config key errors name).
        student_path, student_tokenizer_path: the student's checkpoint and tokenizer.
        trust_remote_code: the student's; each teacher uses its own.

    A checkpoint that cannot be read is an error naming it. Hub ids are fetched by transformers as
    usual (tokenizer and config only).
    """
    from transformers import AutoConfig, AutoTokenizer

    def load(kind, loader, path, key, trust=trust_remote_code):
        try:
            return loader.from_pretrained(path, trust_remote_code=trust), None
        except Exception as exc:  # noqa: BLE001 - reported with the path
            return None, f"{key}={path}: cannot read its {kind} ({type(exc).__name__}: {str(exc).splitlines()[0]})"

    tok_path = student_tokenizer_path or student_path
    student_tok, e1 = load("tokenizer", AutoTokenizer, tok_path, "actor_rollout_ref.model.tokenizer_path"
                           if student_tokenizer_path else "actor_rollout_ref.model.path")
    student_cfg, e2 = load("config.json", AutoConfig, student_path, "actor_rollout_ref.model.path")
    errors = [e for e in (e1, e2) if e]
    toks, cfgs, paths = {}, {}, {}
    for t in teachers.values():
        name = t.model_path_key.removesuffix(".model_path")  # what the errors call the teacher
        toks[name], e1 = load("tokenizer", AutoTokenizer, t.model_path, t.model_path_key, t.trust_remote_code)
        cfgs[name], e2 = load("config.json", AutoConfig, t.model_path, t.model_path_key, t.trust_remote_code)
        paths[name] = t.model_path
        errors += [e for e in (e1, e2) if e]
    if student_tok is not None:
        errors += validate_tokenizers(student_tok, {p: t for p, t in toks.items() if t is not None},
                                      student_path=tok_path, teacher_paths=paths)
    if student_cfg is not None:
        errors += validate_model_configs(student_cfg, {p: c for p, c in cfgs.items() if c is not None},
                                         student_path=student_path, teacher_paths=paths)
    return errors

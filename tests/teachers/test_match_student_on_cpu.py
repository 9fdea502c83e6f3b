"""A teacher must read the student's token ids and pixel patches the way the student produced them:
its tokenizer (vocabulary, special ids) and ``config.json`` (image token ids, ``vision_config``
patch sizes) are compared with the student's in ``validate-recipe`` (local folders) and when the
trainer builds the worker teachers. Tiny local checkpoints: tokenizers and configs only."""

import pathlib

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3VLConfig

from verl_mopd.errors import ConfigError
from verl_mopd.teachers.config import compare_with_student
from verl_mopd.config import MOPDConfig
from verl_mopd.checks.recipe_cli import compose_recipe
from verl_mopd.checks.validate import validate

ROOT = pathlib.Path(__file__).parents[2]
SMALL = ROOT / "recipes" / "ui_mopd" / "stage2_mopd_small.yaml"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
           "<|video_pad|>"]
WORDS = ["click", "tap", "the", "button", "</think>"]


def _checkpoint(path, *, words=WORDS, special=SPECIAL, eos="<|im_end|>", vision=True, **overrides):
    """``config.json`` + tokenizer of a tiny Qwen3-VL (or a text-only Qwen3-VL-shaped config)."""
    path.mkdir(parents=True, exist_ok=True)
    vocab = {t: i for i, t in enumerate(special + ["[UNK]"] + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token="<|endoftext|>", unk_token="[UNK]",
                            additional_special_tokens=special[1:]).save_pretrained(path)
    vision_config = {"patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "depth": 1,
                     "hidden_size": 32, "num_heads": 2, "out_hidden_size": 32}
    vision_config.update({k: overrides.pop(k) for k in list(overrides) if k in vision_config})
    ids = {"image_token_id": vocab["<|image_pad|>"], "video_token_id": vocab["<|video_pad|>"],
           "vision_start_token_id": vocab["<|vision_start|>"], "vision_end_token_id": vocab["<|vision_end|>"]}
    ids.update(overrides)
    text = {"vocab_size": len(vocab), "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1}
    cfg = Qwen3VLConfig(text_config=text, vision_config=vision_config, **ids) if vision else Qwen3Config(**text)
    cfg.save_pretrained(path)
    return str(path)


def _teachers(desktop, mobile, backend="hf"):
    return MOPDConfig.from_mapping({"teachers": {
        "desktop": {"model_path": desktop, "backend": backend, "device": "cpu", "dtype": "float32"},
        "mobile": {"model_path": mobile, "backend": backend, "device": "cpu", "dtype": "float32"}}})


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    return {
        "student": _checkpoint(root / "student"),
        "same": _checkpoint(root / "same"),
        "added_token": _checkpoint(root / "added_token", words=WORDS + ["<desktop_action>"]),
        "swapped": _checkpoint(root / "swapped", words=["tap", "click", *WORDS[2:]]),
        "eos": _checkpoint(root / "eos", eos="<|endoftext|>"),
        "patch": _checkpoint(root / "patch", patch_size=14),
        "merge": _checkpoint(root / "merge", spatial_merge_size=4),
        "temporal": _checkpoint(root / "temporal", temporal_patch_size=1),
        "image_id": _checkpoint(root / "image_id", image_token_id=3),
        "text_only": _checkpoint(root / "text_only", vision=False),
        "no_tokenizer": str((root / "no_tokenizer").mkdir() or root / "no_tokenizer"),
    }


def test_an_identical_teacher_passes(ckpts):
    assert compare_with_student(_teachers(ckpts["same"], ckpts["same"]).teachers, ckpts["student"]) == []


@pytest.mark.parametrize("teacher, field", [
    ("added_token", "tokenizer vocabulary"),
    ("swapped", "tokenizer vocabulary"),
    ("eos", "tokenizer eos_token_id"),
    ("patch", "vision_config.patch_size"),
    ("merge", "vision_config.spatial_merge_size"),
    ("temporal", "vision_config.temporal_patch_size"),
    ("image_id", "config image_token_id"),
    ("text_only", "the student has a vision tower"),
    ("no_tokenizer", "cannot read its tokenizer"),
])
def test_a_mismatch_names_both_paths_and_the_field(ckpts, teacher, field):
    errors = compare_with_student(_teachers(ckpts["same"], ckpts[teacher]).teachers, ckpts["student"])
    assert errors and all(e.startswith(("mopd.teachers.mobile", "mopd.teachers.mobile.model_path")) for e in errors)
    text = "\n".join(errors)
    assert field in text and ckpts[teacher] in text
    if teacher != "no_tokenizer":
        assert ckpts["student"] in text


def test_the_values_that_differ_are_in_the_message(ckpts):
    (error,) = compare_with_student(_teachers(ckpts["same"], ckpts["patch"]).teachers, ckpts["student"])
    assert "teacher 14 vs student 16" in error
    (error,) = compare_with_student(_teachers(ckpts["same"], ckpts["swapped"]).teachers, ckpts["student"])
    assert "'click': teacher" in error and "'tap': teacher" in error


def _recipe(student, desktop, mobile, *extra):
    return [f"actor_rollout_ref.model.path={student}", f"mopd.teachers.desktop.model_path={desktop}",
            f"mopd.teachers.mobile.model_path={mobile}", *extra]


def test_validate_recipe_refuses_a_mismatched_teacher_and_accepts_a_matching_one(ckpts):
    problems, warnings = validate(compose_recipe(str(SMALL), _recipe(ckpts["student"], ckpts["same"], ckpts["same"])))
    assert not [p for p in problems if "mopd.teachers" in p], problems
    assert not [w for w in warnings if "not compared" in w], warnings
    problems, _ = validate(compose_recipe(str(SMALL), _recipe(ckpts["student"], ckpts["merge"], ckpts["added_token"])))
    text = "\n".join(problems)
    assert f"mopd.teachers.desktop: config vision_config.spatial_merge_size differs from the student's (teacher " \
           f"{ckpts['merge']}, student {ckpts['student']}): teacher 4 vs student 2" in text
    assert "mopd.teachers.mobile: tokenizer vocabulary differs" in text


def test_validate_recipe_says_what_it_could_not_compare(ckpts):
    _, warnings = validate(compose_recipe(str(SMALL), _recipe(ckpts["student"], "/cluster/desktop", ckpts["same"])))
    assert any("mopd.teachers.desktop: tokenizer and vision config not compared" in w
               and "the trainer compares it when it builds the teachers" in w for w in warnings)
    _, warnings = validate(compose_recipe(str(SMALL), _recipe("/cluster/student", ckpts["same"], ckpts["same"])))
    assert any("not compared with the student's: actor_rollout_ref.model.path=/cluster/student" in w for w in warnings)


class _Trainer:
    def __init__(self, config):
        self.config = config


def test_the_trainer_refuses_a_mismatched_teacher_before_any_weights_load(ckpts):
    from verl_mopd.trainer import hooks

    overrides = _recipe(ckpts["student"], ckpts["same"], ckpts["temporal"])  # backend: megatron teachers
    trainer = _Trainer(compose_recipe(str(SMALL), overrides))
    with pytest.raises(ConfigError, match=r"mopd.teachers.mobile: config vision_config.temporal_patch_size "
                                                 r"differs .*teacher 1 vs student 2") as info:
        hooks.build_worker_teachers(trainer)  # the checkpoints have no weights: building would fail differently
    assert ckpts["temporal"] in str(info.value) and ckpts["student"] in str(info.value)

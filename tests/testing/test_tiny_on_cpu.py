"""The tiny Qwen3-VL checkpoints of the smoke load in verl exactly as a real Qwen3-VL folder does."""

import json
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from verl_mopd.testing import tiny
from verl_mopd.testing.cpu.rollout import HFRolloutServer, tensor_digest

TEXTS = [
    "You are a helpful assistant.\n\n# Tools\n<tools>{\"name\": \"computer_use\"}</tools>",
    "Instruction: open the file.\n\nPrevious actions:\nStep 1: do 0\n\n",
    '<think>\nStep 1: proceed.\n</think>\n\n<tool_call>\n{"name": "computer_use", "arguments": '
    '{"action": "left_click", "coordinate": [120, 450]}}\n</tool_call>',
    "Ünïcode, tabs\tand emoji ✓ survive byte-level BPE",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    tokenizer = tiny.build_tokenizer(TEXTS, vocab_size=400)
    processor = tiny.build_processor(tokenizer)
    return {size: tiny.save_model(root / size, tokenizer, processor, size, seed=i)
            for i, size in enumerate(tiny.SIZES)}


def _image(w=96, h=54, shade=200):
    return Image.new("RGB", (w, h), (shade, 120, 40))


def test_the_saved_tokenizer_reloads_as_qwens_and_round_trips(folders):
    from transformers import AutoTokenizer

    tiny.check_tokenizer(folders["student"], TEXTS)  # raises on any failure
    tokenizer = AutoTokenizer.from_pretrained(folders["student"])
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    assert len(tokenizer.encode("\n", add_special_tokens=False)) == 1
    text = '<think>x</think>\n<tool_call>{"a": 1}</tool_call><|im_end|>'
    assert tokenizer.decode(tokenizer.encode(text), skip_special_tokens=True) == text.replace("<|im_end|>", "")


def test_check_tokenizer_refuses_a_word_level_tokenizer_in_a_qwen_folder(tmp_path, folders):
    """The old GPU smoke's tokenizer: transformers 5 reloads it as a byte-level Qwen2Tokenizer, whose
    '\\n' encodes to [] and breaks verl's continuous-token builder on every prompt."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, PreTrainedTokenizerFast

    words = sorted({w for t in TEXTS for w, _ in pre_tokenizers.Whitespace().pre_tokenize_str(t)})
    vocab = {tok: i for i, tok in enumerate(tiny.SPECIAL_TOKENS + tiny.TEXT_TOKENS + ["[UNK]"] + words)}
    word_level = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=word_level, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                            unk_token="[UNK]").save_pretrained(tmp_path)
    AutoConfig.from_pretrained(folders["student"]).save_pretrained(tmp_path)
    with pytest.raises(AssertionError, match="encodes to"):
        tiny.check_tokenizer(tmp_path, TEXTS)


def test_verl_loads_the_processor_with_qwen3_vl_mrope(folders):
    from verl.utils.tokenizer import hf_processor

    processor = hf_processor(str(folders["student"]))
    assert type(processor).__name__ == "Qwen3VLProcessor" and hasattr(processor, "get_rope_index")
    messages = [{"role": "user", "content": [{"type": "text", "text": "Instruction: click\n"}, {"type": "image"}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == ("<|im_start|>user\nInstruction: click\n<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n"
                      "<|im_start|>assistant\n")
    inputs = processor(text=[prompt], images=[_image()], return_tensors="pt")
    grid = inputs["image_grid_thw"][0]
    n_image = int((inputs["input_ids"] == processor.image_token_id).sum())
    assert n_image == int(grid.prod()) // tiny.MERGE_SIZE**2 > 0  # the pad token expanded to the grid


def test_student_and_teacher_share_vocabulary_and_vision_geometry(folders):
    from transformers import AutoConfig, AutoTokenizer

    student, teacher = (AutoConfig.from_pretrained(folders[s]) for s in ("student", "teacher"))
    assert student.text_config.vocab_size == teacher.text_config.vocab_size
    vocab, tokens = student.text_config.vocab_size, len(AutoTokenizer.from_pretrained(folders["student"]))
    assert vocab % tiny.VOCAB_MULTIPLE == 0 and tokens <= vocab < tokens + tiny.VOCAB_MULTIPLE  # Megatron's TP split
    for key in ("patch_size", "spatial_merge_size", "temporal_patch_size"):
        assert getattr(student.vision_config, key) == getattr(teacher.vision_config, key)
    assert student.image_token_id == teacher.image_token_id
    assert student.text_config.hidden_size < teacher.text_config.hidden_size  # the 8B / 32B roles


def test_warm_up_fits_the_assistant_turns(folders, tmp_path):
    import shutil

    folder = tmp_path / "student"
    shutil.copytree(folders["student"], folder)
    examples = [{"messages": [{"role": "user", "content": "Instruction: click\n<image>"},
                              {"role": "assistant", "content": TEXTS[2]}], "images": [_image()]}]
    seen = []
    losses = tiny.warm_up(folder, examples, steps=25, lr=1e-2, on_step=lambda step, loss: seen.append((step, loss)))
    assert losses[-1] < 0.5 * losses[0]
    assert seen == list(enumerate(losses, start=1))  # every step reported, in order, with its loss


def test_a_warm_up_batch_is_what_the_processor_makes_of_the_batch(folders):
    """warm_up processes each example once and pads batches itself: the same tensors as the processor's
    own batch with ``padding=True`` (right), images of some samples only included."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(folders["student"])
    processor.tokenizer.padding_side = "right"
    texts = ["<|vision_start|><|image_pad|><|vision_end|>" + TEXTS[1], TEXTS[2],
             "<|vision_start|><|image_pad|><|vision_end|>" + TEXTS[3]]
    images = [[_image()], [], [_image(64, 64, 10)]]
    samples = []
    for text, pictures in zip(texts, images, strict=True):
        inputs = processor(text=[text], images=pictures or None, return_tensors="pt")
        samples.append((inputs, inputs["input_ids"].clone()))
    for pick in ([1, 0, 2], [0, 1], [1]):
        batch, labels = tiny._right_padded([samples[i] for i in pick], processor.tokenizer.pad_token_id)
        pictures = [im for i in pick for im in images[i]]
        want = processor(text=[texts[i] for i in pick], images=pictures or None, padding=True, return_tensors="pt")
        assert set(batch) == set(want)
        for key in want:
            assert torch.equal(batch[key], want[key]), key
        assert torch.equal(labels[batch["attention_mask"] == 0], torch.full_like(labels[batch["attention_mask"] == 0], -100))


def _server(folder, response_length=12, dtype="float32"):
    config = SimpleNamespace(prompt_length=256, response_length=response_length, dtype=dtype)
    model_config = SimpleNamespace(local_path=str(folder), trust_remote_code=False)
    return HFRolloutServer(config, model_config, replica_rank=0)


def test_the_rollout_generates_with_an_image_and_reports_the_models_log_probs(folders):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    server = _server(folders["student"])
    processor = AutoProcessor.from_pretrained(folders["student"])
    messages = [{"role": "user", "content": [{"type": "text", "text": "Instruction: click\n"}, {"type": "image"}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    image = _image()
    ids = processor(text=[prompt], images=[image], return_tensors="pt")["input_ids"][0].tolist()
    torch.manual_seed(0)
    tokens, log_probs, _ = server._generate(ids, {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True},
                                            [image])
    assert 0 < len(tokens) <= 12 and len(log_probs) == len(tokens)
    # the reported log-probs are the model's own for the sampled tokens, with the image in the input
    model = AutoModelForImageTextToText.from_pretrained(folders["student"], dtype=torch.float32).eval()
    full = torch.tensor([ids + tokens])
    pixels = processor.image_processor(images=[image], return_tensors="pt")
    with torch.no_grad():
        logits = model(input_ids=full, pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"],
                       mm_token_type_ids=(full == model.config.image_token_id).int()).logits[0].double()
    want = torch.log_softmax(logits[len(ids) - 1 : -1], -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(log_probs, dtype=torch.float64), want, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="min_p"):
        server._generate(ids, {"temperature": 1.0, "min_p": 0.1}, [image])

    # in verl's default rollout dtype (bfloat16, under autocast) the same tokens' log-probs are off the fp32
    # model's by what bf16 arithmetic costs: the IS weights of rollout correction are not 1
    bf16 = _server(folders["student"], dtype="bfloat16")
    torch.manual_seed(0)
    greedy = {"temperature": 0.0, "logprobs": True}
    tokens_bf16, log_probs_bf16, _ = bf16._generate(ids, greedy, [image])
    tokens_fp32, log_probs_fp32, _ = server._generate(ids, greedy, [image])
    n = next((i for i, (a, b) in enumerate(zip(tokens_bf16, tokens_fp32)) if a != b), len(tokens_bf16))
    gap = (torch.tensor(log_probs_bf16[:n]) - torch.tensor(log_probs_fp32[:n])).abs().max().item()
    assert n > 0 and 1e-4 < gap < 0.2, (n, gap)
    with pytest.raises(ValueError, match="rollout.dtype='int8'"):
        _server(folders["student"], dtype="int8")


def test_a_weight_sync_loads_every_tensor_and_refuses_unknown_names(folders):
    server = _server(folders["student"])
    state = {name: torch.randn_like(t) for name, t in server.model.state_dict().items()}
    held = server.update_weights(state)
    assert held == {name: tensor_digest(t) for name, t in state.items()}
    with pytest.raises(RuntimeError, match="does not have"):
        server.update_weights({"model.not_a_layer.weight": torch.zeros(1)})
    partial = dict(list(state.items())[:3])
    partial = {k: v + 1 for k, v in partial.items()}
    held = server.update_weights(partial)  # a partial sync shows as digests that differ from what was sent
    assert sum(held[k] != tensor_digest(state[k]) for k in state) == 3
    assert json.dumps(held)  # the sync log writes it as JSON

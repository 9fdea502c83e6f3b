"""Tiny local Qwen3-VL checkpoints (tokenizer, processor, random weights): no download, any machine.

What a real Qwen3-VL checkpoint folder holds, at toy sizes, so that verl loads it exactly as it loads
the real one (``AutoTokenizer`` / ``AutoProcessor`` / ``AutoModelForImageTextToText``):

- :func:`build_tokenizer`: a byte-level BPE trained on the run's own texts, built as transformers'
  ``Qwen2Tokenizer`` (the class ``AutoTokenizer`` gives a ``qwen3_vl`` folder), with Qwen's special
  tokens and a ChatML chat template that renders image items as
  ``<|vision_start|><|image_pad|><|vision_end|>``. Byte-level, as Qwen's: every string encodes
  (``"\\n"`` to one token, which verl's Qwen continuous-token builder requires) and decodes back.
  :func:`check_tokenizer` reloads the saved folder and checks exactly that.
- :func:`build_processor`: ``Qwen3VLProcessor`` with Qwen3-VL's own patch geometry (patch 16,
  spatial merge 2, temporal patch 2).
- :func:`save_model`: a random ``Qwen3VLForConditionalGeneration`` (vision tower, deepstack, mrope)
  of one of :data:`SIZES`; the student and the teachers share tokenizer and vision geometry, as the
  real 8B student and 32B teachers do.
- :func:`warm_up`: a short supervised warm-up on the SFT data (a plain torch loop), standing in for a
  pretrained checkpoint: a random model never emits a parseable tool call, so every reward would be
  the same and the policy gradient zero.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["SIZES", "SPECIAL_TOKENS", "TEXT_TOKENS", "build_processor", "build_tokenizer", "check_tokenizer", "save_model",
           "sft_examples", "warm_up"]

PAD, EOS = "<|endoftext|>", "<|im_end|>"
#: control tokens, special as in Qwen3-VL's tokenizer (``decode(skip_special_tokens=True)`` drops them)
SPECIAL_TOKENS = [PAD, "<|im_start|>", EOS, "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
#: tags the model writes: single tokens but NOT special, as in Qwen3-VL, so the decoded text the
#: reward parses keeps them
TEXT_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
PATCH_SIZE, MERGE_SIZE, TEMPORAL_PATCH_SIZE = 16, 2, 2  # Qwen3-VL's vision geometry
#: text hidden size, layers, heads, kv heads, head dim (mrope sections split head_dim / 2 as 2:1:1)
SIZES = {
    "student": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "teacher": dict(hidden_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=24),
}

#: ChatML as Qwen's templates render it: ``<|im_start|>{role}\n{content}<|im_end|>\n`` per message, image
#: items as ``<|vision_start|><|image_pad|><|vision_end|>`` (the processor expands the pad token)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or 'image' in item or 'image_url' in item %}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif item['type'] == 'video' or 'video' in item %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _message_texts(messages: Iterable[dict]) -> list[str]:
    texts = []
    for message in messages:
        content = message["content"]
        if isinstance(content, str):
            texts.append(content.replace("<image>", ""))
        else:
            texts.extend(item.get("text", "") for item in content if isinstance(item, dict))
    return texts


def corpus(parquet_files: Sequence[str | os.PathLike]) -> list[str]:
    """Every message text of the given verl parquet files (``prompt`` or ``messages`` columns)."""
    import pandas as pd

    texts = []
    for path in parquet_files:
        frame = pd.read_parquet(path)
        for column in ("prompt", "messages"):
            if column in frame.columns:
                for messages in frame[column]:
                    texts.extend(_message_texts(messages))
    return texts


def build_tokenizer(texts: Sequence[str], vocab_size: int = 1024):
    """A byte-level BPE ``Qwen2Tokenizer`` trained on ``texts``, with Qwen's special tokens and chat template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    # the exact pipeline Qwen2Tokenizer rebuilds on load, so the trained merges apply the same way
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS + TEXT_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(list(texts), trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tokenizer = Qwen2Tokenizer(vocab=model["vocab"], merges=merges, unk_token=None, eos_token=EOS, pad_token=PAD,
                               extra_special_tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                                                     "vision_start_token": "<|vision_start|>",
                                                     "vision_end_token": "<|vision_end|>"})
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[1:]})
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TEXT_TOKENS])
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def check_tokenizer(folder: str | os.PathLike, texts: Sequence[str]) -> None:
    """Reload ``folder`` as verl does and check it round-trips ``texts`` and encodes ``"\\n"`` to one token.

    Raises:
        AssertionError naming the first text that does not survive.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    newline = tokenizer.encode("\n", add_special_tokens=False)
    assert len(newline) == 1, f"{folder}: '\\n' encodes to {newline}; verl's Qwen continuous-token builder needs one token"
    for token in SPECIAL_TOKENS + TEXT_TOKENS:
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1, f"{folder}: {token!r} encodes to {ids}, not one token"
    for token in TEXT_TOKENS:  # what verl's reward loop decodes (skip_special_tokens=True) must keep them
        kept = tokenizer.decode(tokenizer.encode(f"a{token}b", add_special_tokens=False), skip_special_tokens=True)
        assert kept == f"a{token}b", f"{folder}: {token!r} is dropped by skip_special_tokens ({kept!r})"
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", f"{folder}: chat template renders {chat!r}"
    for text in texts:
        back = tokenizer.decode(tokenizer.encode(text, add_special_tokens=False))
        assert back == text, f"{folder}: {text[:60]!r} decodes back as {back[:60]!r}"


def build_processor(tokenizer):
    """``Qwen3VLProcessor`` over ``tokenizer`` with Qwen3-VL's patch geometry and our chat template."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    geometry = dict(patch_size=PATCH_SIZE, merge_size=MERGE_SIZE, temporal_patch_size=TEMPORAL_PATCH_SIZE)
    size = {"shortest_edge": 4 * (PATCH_SIZE * MERGE_SIZE) ** 2, "longest_edge": 256 * (PATCH_SIZE * MERGE_SIZE) ** 2}
    return Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(size=size, **geometry), tokenizer=tokenizer,
                            video_processor=Qwen3VLVideoProcessor(size=size, **geometry), chat_template=CHAT_TEMPLATE)


#: the embedding rows are a multiple of this, as Qwen's are (151,936 rows for 151,669 tokens): Megatron
#: splits the vocabulary over the tensor-parallel ranks, so it must divide by TP (up to 8)
VOCAB_MULTIPLE = 8


def padded_vocab_size(tokenizer) -> int:
    """``len(tokenizer)`` rounded up to :data:`VOCAB_MULTIPLE`."""
    return -(-len(tokenizer) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def model_config(tokenizer, size: str):
    """``Qwen3VLConfig`` of ``size`` for ``tokenizer`` (vision geometry shared by every size)."""
    from transformers import Qwen3VLConfig

    if size not in SIZES:
        raise ValueError(f"size={size!r}: allowed {sorted(SIZES)}")
    text = SIZES[size]
    half = text["head_dim"] // 2
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in
           (("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    return Qwen3VLConfig(
        text_config=dict(vocab_size=padded_vocab_size(tokenizer), intermediate_size=2 * text["hidden_size"],
                         max_position_embeddings=4096, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "mrope_section": [half - 2 * (half // 4), half // 4, half // 4],
                                          "mrope_interleaved": True},
                         **text),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=text["hidden_size"], patch_size=PATCH_SIZE, spatial_merge_size=MERGE_SIZE,
                           temporal_patch_size=TEMPORAL_PATCH_SIZE, num_position_embeddings=256,
                           deepstack_visual_indexes=[0]),
        tie_word_embeddings=False, **ids)


def save_model(folder: str | os.PathLike, tokenizer, processor, size: str, seed: int) -> Path:
    """A random Qwen3-VL of ``size`` in ``folder``, with tokenizer, processor and generation config."""
    from transformers import GenerationConfig, Qwen3VLForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(model_config(tokenizer, size)).float()
    model.generation_config = GenerationConfig(eos_token_id=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id)
    folder = Path(folder)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def sft_examples(parquet_files: Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    """Rows of verl SFT parquet files as ``{"messages": [...], "images": [PIL, ...]}``."""
    from io import BytesIO

    import pandas as pd
    from PIL import Image

    rows = []
    for path in parquet_files:
        frame = pd.read_parquet(path)
        for messages, images in zip(frame["messages"], frame["images"], strict=True):
            pictures = [Image.open(BytesIO(im["bytes"])).convert("RGB") for im in images]
            rows.append({"messages": [dict(m) for m in messages], "images": pictures})
    return rows


def _chat(messages: list[dict]) -> list[dict]:
    """``<image>`` placeholders as image items, the way verl's datasets hand messages to the processor."""
    out = []
    for message in messages:
        parts = str(message["content"]).split("<image>")
        content: list[dict] = []
        for i, part in enumerate(parts):
            if i:
                content.append({"type": "image"})
            if part:
                content.append({"type": "text", "text": part})
        out.append({"role": message["role"], "content": content})
    return out


def warm_up(folder: str | os.PathLike, examples: Sequence[dict[str, Any]], steps: int, lr: float = 3e-3,
            batch_size: int = 8, seed: int = 0, on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """Train the model in ``folder`` on the assistant turns of ``examples``, in place (AdamW, constant lr).

    Each step is a batch of ``batch_size`` examples drawn without replacement (reshuffled per pass),
    right-padded; the loss is the token mean over the assistant turns (prompts and padding masked).
    ``on_step(step, loss)`` is called after each step (1-based), for progress.

    Returns:
        the loss of every step.
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    model.train()
    samples = []  # each example processed once (the image processor is most of a step's cost otherwise)
    for example in examples:
        *context, answer = _chat(example["messages"])
        prompt = processor.apply_chat_template(context, add_generation_prompt=True, tokenize=False)
        text = prompt + answer["content"][0]["text"] + EOS + "\n"
        pictures = list(example["images"]) or None
        inputs = processor(text=[text], images=pictures, return_tensors="pt")
        labels = inputs["input_ids"].clone()
        labels[0, : len(processor(text=[prompt], images=pictures)["input_ids"][0])] = -100
        samples.append((inputs, labels))
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    order: list[int] = []
    losses = []
    for _ in range(steps):
        if len(order) < batch_size:
            order += torch.randperm(len(examples), generator=generator).tolist()
        pick, order = order[:batch_size], order[batch_size:]
        inputs, labels = _right_padded([samples[i] for i in pick], processor.tokenizer.pad_token_id)
        loss = model(**inputs, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(len(losses), losses[-1])
    model.eval()
    model.save_pretrained(folder)
    return losses


def _right_padded(samples: Sequence[tuple[dict, torch.Tensor]], pad_id: int) -> tuple[dict, torch.Tensor]:
    """One batch of separately processed samples, as the processor would have made it with ``padding=True``
    (``padding_side="right"``): per-token rows right-padded (``input_ids`` with ``pad_id``, masks with 0,
    labels with -100), images concatenated in sample order."""
    width = max(inputs["input_ids"].shape[1] for inputs, _ in samples)

    def pad(row: torch.Tensor, value: int) -> torch.Tensor:
        return torch.nn.functional.pad(row, (0, width - row.shape[1]), value=value)

    batch = {}
    for key in dict.fromkeys(key for inputs, _ in samples for key in inputs):
        rows = [inputs[key] for inputs, _ in samples if key in inputs]
        if key in ("pixel_values", "image_grid_thw"):
            batch[key] = torch.cat(rows)
        else:
            batch[key] = torch.cat([pad(row, pad_id if key == "input_ids" else 0) for row in rows])
    return batch, torch.cat([pad(labels, -100) for _, labels in samples])


"""Tiny local models for the demo: a word-level tokenizer and small Qwen3 causal LMs (random init).

Nothing is downloaded. The tokenizer (``tokenizers`` WordLevel, wrapped in ``transformers``'
``PreTrainedTokenizerFast``) has one token per JSON punctuation mark, per quoted JSON string
(``"left_click"``, ``"coordinate"``), per number and per word, so a tool call is ~25 tokens and
decoding (tokens joined by spaces) is still valid JSON for the reward's parser.
"""

from __future__ import annotations

import torch
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen3Config

from verl_mopd.demo.config import SIZES
from verl_mopd.demo.tasks import corpus

__all__ = ["SIZES", "PAD", "EOS", "UNK", "build_tokenizer", "build_model"]

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
_PIECES = Regex(r'"[^"]*"|</?tool_call>|[{}\[\]:,|]|[^\s{}\[\]:,|"]+')


def _pre_tokenizer():
    return pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(_PIECES, "isolated")])


def build_tokenizer(texts: list[str] | None = None) -> PreTrainedTokenizerFast:
    """Word-level tokenizer over every piece of ``texts`` (default: every piece a task can produce).

    Ids: 0 ``<pad>``, 1 ``<eos>``, 2 ``<unk>``, then the pieces in sorted order (deterministic).
    """
    pre = _pre_tokenizer()
    pieces = sorted({p for t in (texts if texts is not None else corpus()) for p, _ in pre.pre_tokenize_str(t)})
    vocab = {PAD: 0, EOS: 1, UNK: 2} | {p: i + 3 for i, p in enumerate(pieces)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK)


def build_model(tokenizer: PreTrainedTokenizerFast, size: str = "tiny", seed: int = 0) -> torch.nn.Module:
    """A randomly initialized Qwen3 causal LM (float32) of ``size`` for ``tokenizer``'s vocabulary.

    Weights are drawn with std ``hidden_size ** -0.5`` (the fan-in scale), not Qwen3's default 0.02,
    which is that scale for hidden ~2500-4096: at hidden 64 it makes every attention logit ~0 at init,
    and learning to copy a coordinate from the prompt then sits on a plateau for 400-600+ steps (or
    never leaves it, depending on the seed); at the fan-in scale it is learned in ~100.
    """
    if size not in SIZES:
        raise ValueError(f"size={size!r}: allowed {sorted(SIZES)}")
    dims = SIZES[size]
    cfg = Qwen3Config(
        vocab_size=len(tokenizer), intermediate_size=2 * dims["hidden_size"],
        head_dim=dims["hidden_size"] // dims["num_attention_heads"], max_position_embeddings=128,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None, initializer_range=dims["hidden_size"] ** -0.5, **dims,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)

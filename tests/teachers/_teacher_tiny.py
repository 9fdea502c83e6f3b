"""Tiny random causal LMs and step batches for the teacher tests (no downloads)."""

import numpy as np
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

VOCAB = 96


def save_tiny_lm(path, seed: int, hidden: int = 32, layers: int = 2) -> str:
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(path)
    return str(path)


def padded_batch(platforms, prompt_len=6, response_len=5, seed=0):
    """verl's padded layout: left-padded prompt, right-padded response, ragged true lengths."""
    rng = np.random.default_rng(seed)
    n = len(platforms)
    input_ids = torch.zeros(n, prompt_len + response_len, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i in range(n):
        p, r = int(rng.integers(1, prompt_len + 1)), int(rng.integers(1, response_len + 1))
        input_ids[i, prompt_len - p : prompt_len + r] = torch.as_tensor(rng.integers(1, VOCAB, size=p + r))
        attention_mask[i, prompt_len - p : prompt_len + r] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    tensors = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
               "responses": input_ids[:, prompt_len:].clone(), "response_mask": attention_mask[:, prompt_len:].clone()}
    return tensors, np.array(platforms, dtype=object)


@torch.no_grad()
def direct_logprobs(model, input_ids, attention_mask, response_len):
    """Independent reference: each sample alone, unpadded, float64 log-softmax; 0.0 after the response."""
    out = torch.zeros(input_ids.shape[0], response_len, dtype=torch.float64)
    for i in range(input_ids.shape[0]):
        seq = input_ids[i][attention_mask[i].bool()]
        r = int(attention_mask[i, -response_len:].sum())
        logits = model(input_ids=seq[None]).logits[0].double()
        lp = torch.log_softmax(logits[:-1], -1).gather(-1, seq[1:, None])[:, 0]
        out[i, :r] = lp[len(seq) - 1 - r :]
    return out

"""Build the inputs of the one-GPU smoke run: tiny random Qwen2 student and teachers, a text-only
RL parquet in `verl-mopd prepare`'s layout. Used by scripts/gpu_smoke.sh (no downloads)."""

import json
import sys
from pathlib import Path

import pandas as pd
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

from verl_mopd.rewards import system_prompt

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"]


def build_tokenizer(texts, out: Path):
    words = sorted({w for t in texts for w in pre_tokenizers.Whitespace().pre_tokenize_str(t) for w in [w[0]]})
    vocab = {tok: i for i, tok in enumerate(SPECIAL + ["[UNK]"] + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token="[UNK]", additional_special_tokens=SPECIAL[1:])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(tokenizer, out: Path, seed: int):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    tokenizer.save_pretrained(out)


def main(root: str):
    root = Path(root)
    rows = []
    for i in range(32):
        platform = "desktop" if i % 2 else "mobile"
        action = {"action": "left_click" if platform == "desktop" else "click", "coordinate": [100 + i, 200]}
        truth = {"platform": platform, "action": action, "bbox": [50, 150, 250, 250]}
        rows.append({
            "data_source": f"smoke_{platform}", "platform": platform, "ability": "gui_agent",
            "prompt": [{"role": "system", "content": system_prompt(platform)},
                       {"role": "user", "content": f"Instruction: press the button {i}"}],
            "reward_model": {"style": "rule", "ground_truth": json.dumps(truth)},
            "extra_info": {"platform": platform, "index": i},
        })
    texts = [m["content"] for r in rows for m in r["prompt"]] + ["{ } [ ] : , \" click left_click coordinate"]
    tokenizer = build_tokenizer(texts, root / "tokenizer")
    for name, seed in (("student", 0), ("desktop", 1), ("mobile", 2)):
        build_model(tokenizer, root / name, seed)
    (root / "data").mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows[:24]).to_parquet(root / "data" / "train.parquet")
    pd.DataFrame(rows[24:]).to_parquet(root / "data" / "val.parquet")


if __name__ == "__main__":
    main(sys.argv[1])

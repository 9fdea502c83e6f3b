"""Inputs and checks of the one-GPU smoke run (scripts/gpu_smoke.sh). No downloads.

    python scripts/gpu_smoke.py build ROOT      # tiny random Qwen2 student + two teachers, tokenizer, parquet
    python scripts/gpu_smoke.py overrides ROOT  # the entry point's hydra overrides, one a line
    python scripts/gpu_smoke.py preflight ROOT  # the Megatron engine's imports are there (verl-mopd check)
    python scripts/gpu_smoke.py verify ROOT     # assertions on ROOT/metrics.jsonl and ROOT/teacher_dumps/

``verify`` asserts, for each of the 3 training steps: the student's K3 (``actor/mopd/k3_mean_kl_on``) is
finite; the reward gate's on-fraction (``mopd/kl_mask_on_fraction``) is strictly between 0 and 1;
both teachers scored samples; and the stored ``teacher_logprobs`` of the dumped samples equal a direct
transformers forward of the teacher checkpoint on the same tokens (hf teacher: float32, 1e-4; megatron
teacher: bfloat16 Megatron kernels against float32, 0.1 nats; a prompt/response mix-up is off by
whole nats).
"""

import json
import math
import sys
from pathlib import Path

import torch

STEPS = 3
TOLERANCE = {"hf": 1e-4, "megatron": 0.1}
BACKENDS = {"desktop": "hf", "mobile": "megatron"}


def build_tokenizer(texts, out: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"]
    words = sorted({w[0] for t in texts for w in pre_tokenizers.Whitespace().pre_tokenize_str(t)})
    vocab = {tok: i for i, tok in enumerate(special + ["[UNK]"] + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token="[UNK]", additional_special_tokens=special[1:])
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fast.save_pretrained(out)
    return fast


def build_model(tokenizer, out: Path, seed: int):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    # head_dim 64: the attention kernels of SGLang, flash-attention and Transformer Engine all take it
    cfg = Qwen2Config(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                      tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    tokenizer.save_pretrained(out)


def build(root: Path):
    import pandas as pd

    from verl_mopd.rewards import system_prompt

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


def overrides(root: Path) -> list[str]:
    """The entry point's overrides: verl's ppo_trainer + mopd defaults (Megatron student), 1 GPU, 3 steps."""
    here = Path(__file__).resolve().parent
    return [
        f"data.train_files={root}/data/train.parquet", f"data.val_files={root}/data/val.parquet", "data.shuffle=false",
        "data.train_batch_size=4", "data.max_prompt_length=1024", "data.max_response_length=32", "data.image_key=null",
        f"actor_rollout_ref.model.path={root}/student",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.enforce_eager=true", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        f"reward.custom_reward_function.path={here}/gpu_smoke_reward.py", "reward.custom_reward_function.name=smoke_score",
        "mopd.tau_kl=0.5",
        f"+mopd.teachers.desktop={{model_path: {root}/desktop, backend: hf, device: cpu, dtype: float32}}",
        f"+mopd.teachers.mobile={{model_path: {root}/mobile, backend: megatron, placement: colocated, dtype: bfloat16}}",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", f"trainer.total_training_steps={STEPS}",
        "trainer.logger=[console,file]", "trainer.val_before_train=false", "trainer.save_freq=-1", "trainer.test_freq=-1",
        f"trainer.default_local_dir={root}/ckpt",
    ]


@torch.no_grad()
def direct_response_logprobs(model, input_ids: torch.Tensor, n_response: int) -> torch.Tensor:
    device = next(model.parameters()).device
    logits = model(input_ids=input_ids[None].to(device)).logits[0].double().cpu()
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, input_ids[1:, None])[:, 0]
    return lp[len(input_ids) - 1 - n_response :]


def preflight(root: Path) -> None:
    from verl_mopd.teachers.backends.megatron import check_megatron_stack

    if not check_megatron_stack():
        sys.exit("the Megatron engine cannot be built here (see above); install verl-mopd[megatron] on a CUDA machine")


def verify(root: Path) -> None:
    from transformers import AutoModelForCausalLM

    records = [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = {r["step"]: r["data"] for r in records if "actor/mopd/k3_mean_kl_on" in r["data"]}
    assert len(steps) >= STEPS, f"expected {STEPS} training steps with the MOPD loss, found {sorted(steps)}"
    for step, m in sorted(steps.items()):
        k3, on = m["actor/mopd/k3_mean_kl_on"], m["mopd/kl_mask_on_fraction"]
        assert math.isfinite(k3), f"step {step}: K3 {k3} is not finite"
        assert 0.0 < on < 1.0, f"step {step}: reward-gate on-fraction {on} is not strictly between 0 and 1"
        for platform in BACKENDS:
            assert m[f"mopd_teacher/{platform}/scored_samples"] > 0, f"step {step}: {platform} teacher scored nothing"
        print(f"step {step}: K3 {k3:.4f}, gate on {on:.2f}, scored desktop/mobile "
              f"{m['mopd_teacher/desktop/scored_samples']:.0f}/{m['mopd_teacher/mobile/scored_samples']:.0f}")

    dumps = sorted((root / "teacher_dumps").glob("*.pt"))
    assert len(dumps) >= STEPS, f"expected a teacher dump per step, found {len(dumps)}"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    models = {p: AutoModelForCausalLM.from_pretrained(root / p, dtype=torch.float32).to(device).eval()
              for p in BACKENDS}
    seen = set()
    for dump in dumps:
        for row in torch.load(dump, weights_only=False):
            want = direct_response_logprobs(models[row["platform"]], row["input_ids"], len(row["teacher"]))
            err = (row["teacher"].double() - want).abs().max().item()
            backend = BACKENDS[row["platform"]]
            assert err <= TOLERANCE[backend], f"{dump.name}: {row['platform']} ({backend}) teacher off by {err:.3g}"
            seen.add(row["platform"])
    assert seen == set(BACKENDS), f"teacher log-probs checked only for {sorted(seen)}"
    print("SMOKE OK")


if __name__ == "__main__":
    command, root = sys.argv[1], Path(sys.argv[2]).resolve()
    if command == "overrides":
        print("\n".join(overrides(root)))
    else:
        {"build": build, "preflight": preflight, "verify": verify}[command](root)

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


# ---------------------------------------------------------------------------------- Qwen3-VL

VL_VOCAB = 128
IMAGE, VISION_START, VISION_END = VL_VOCAB - 3, VL_VOCAB - 4, VL_VOCAB - 5
PATCH, MERGE, TEMPORAL = 4, 2, 2


def save_tiny_vl(path, seed: int) -> str:
    """A random Qwen3-VL (vision tower + mrope text model) small enough for CPU tests."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    torch.manual_seed(seed)
    cfg = Qwen3VLConfig(
        text_config=dict(vocab_size=VL_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=1024,
                         rope_scaling={"rope_type": "default", "mrope_section": [2, 1, 1], "mrope_interleaved": True},
                         tie_word_embeddings=False),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32,
                           patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL,
                           num_position_embeddings=64, deepstack_visual_indexes=[0]),
        image_token_id=IMAGE, video_token_id=VL_VOCAB - 2, vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END, tie_word_embeddings=False)
    Qwen3VLForConditionalGeneration(cfg).save_pretrained(path)
    return str(path)


def vl_sample(model, rng, *, image_hw: tuple[int, int] | None, prompt_len: int, response_len: int,
              responses: list[torch.Tensor] | None = None) -> dict | list[dict]:
    """One trajectory as verl's v1 agent loop stores it (``agent_loop_tq._agent_loop_postprocess``):
    ``prompts``, ``responses``, ``input_ids``, ``response_mask`` = ``loss_mask``, ``position_ids``
    ``(4, L)`` (text row + the model's ``get_rope_index`` mrope rows) and ``multi_modal_inputs``.

    ``responses``: the rollouts of one prompt (a GRPO group): a list of samples, one per response,
    with the same prompt and equal, separately stored copies of its ``multi_modal_inputs``."""
    if responses is not None:
        one = vl_sample(model, rng, image_hw=image_hw, prompt_len=prompt_len, response_len=1)
        return [_with_response(model, one, r) for r in responses]
    mm, image_tokens = {}, []
    if image_hw is not None:
        h, w = image_hw
        grid = torch.tensor([[1, h, w]])
        mm = {"pixel_values": torch.as_tensor(rng.standard_normal((h * w, 3 * TEMPORAL * PATCH * PATCH)),
                                              dtype=torch.float32), "image_grid_thw": grid}
        image_tokens = [VISION_START] + [IMAGE] * (h * w // MERGE**2) + [VISION_END]
    text = rng.integers(1, VL_VOCAB - 8, size=prompt_len).tolist()
    prompts = torch.tensor(text[:2] + image_tokens + text[2:])
    responses = torch.as_tensor(rng.integers(1, VL_VOCAB - 8, size=response_len))
    return _with_response(model, {"prompts": prompts, "multi_modal_inputs": mm}, responses)


def _with_response(model, sample: dict, responses: torch.Tensor) -> dict:
    prompts, mm = sample["prompts"], {k: v.clone() for k, v in sample["multi_modal_inputs"].items()}
    response_len = len(responses)
    input_ids = torch.cat([prompts, responses])
    mrope, _ = model.model.get_rope_index(input_ids[None], mm_token_type_ids=(input_ids == IMAGE).int()[None],
                                          image_grid_thw=mm.get("image_grid_thw"))
    position_ids = torch.cat([torch.arange(len(input_ids))[None], mrope[:, 0]], dim=0)
    mask = torch.ones(response_len, dtype=torch.int64)
    return {"prompts": prompts, "responses": responses, "input_ids": input_ids, "response_mask": mask,
            "loss_mask": mask.clone(), "attention_mask": torch.ones_like(input_ids), "position_ids": position_ids,
            "multi_modal_inputs": mm}


@torch.no_grad()
def direct_vl_logprobs(model, sample: dict) -> torch.Tensor:
    """Independent reference: the sample alone, transformers computing its own mrope, float64."""
    ids = sample["input_ids"][None]
    kwargs = {}
    if sample["multi_modal_inputs"]:
        kwargs = dict(sample["multi_modal_inputs"], mm_token_type_ids=(ids == IMAGE).int())
    logits = model(input_ids=ids, **kwargs).logits[0].double()
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    return lp[len(ids[0]) - 1 - len(sample["responses"]) :]


def store_groups(tq, model, *, groups: int, rollouts: int, seed: int, image_hw=(16, 12), shuffle=True,
                 platform_of=lambda g: "desktop"):
    """``groups`` prompts x ``rollouts`` responses, stored as verl's agent loop stores them (keys
    ``{uid}_{session}_0``, one copy of the screenshot per rollout), in a shuffled order (verl's
    ``_balance_batch`` reorders the step); the gate on for every row."""
    from tensordict import TensorDict
    from transfer_queue import KVBatchMeta
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    rng = np.random.default_rng(seed)
    samples, keys = [], []
    for g in range(groups):
        responses = [torch.as_tensor(rng.integers(1, VL_VOCAB - 8, size=int(rng.integers(2, 7))))
                     for _ in range(rollouts)]
        for s, sample in enumerate(vl_sample(model, rng, image_hw=image_hw, prompt_len=5, response_len=0,
                                             responses=responses)):
            sample.update(platform=platform_of(g))
            samples.append(sample)
            keys.append(f"uid-{seed}-{g}_{s}_0")
    order = rng.permutation(len(keys)) if shuffle else np.arange(len(keys))
    samples, keys = [samples[i] for i in order], [keys[i] for i in order]
    tags = [{"status": "success", "prompt_len": len(s["prompts"]), "response_len": len(s["responses"])}
            for s in samples]
    tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(samples), tags=tags)
    tq.kv_batch_put(keys=keys, partition_id="train", fields=TensorDict({
        "old_log_probs": torch.nested.as_nested_tensor([-torch.rand(len(s["responses"])) for s in samples],
                                                       layout=torch.jagged),
        "mopd_kl_mask": torch.ones(len(keys))}, batch_size=[len(keys)]))
    return KVBatchMeta(keys=keys, tags=tags, partition_id="train"), samples


def colocated_vl_teachers(root, micro_batch_tokens: int):
    """Two colocated tiny Qwen3-VL ``hf`` CPU teachers (desktop, mobile) saved under ``root``, and the
    memory plan of them (sizes from their ``config.json``, actor offloaded, SGLang at 0.6):
    ``(MOPDConfig, {platform: path}, TeacherPlan)``."""
    from verl_mopd.config import MOPDConfig
    from verl_mopd.teachers.placement import checkpoint_params, plan_teachers

    paths = {p: save_tiny_vl(root / p, seed=s) for p, s in (("desktop", 11), ("mobile", 22))}
    cfg = MOPDConfig.from_mapping({"teachers": {p: {
        "model_path": path, "backend": "hf", "device": "cpu", "dtype": "float32", "placement": "colocated",
        "micro_batch_tokens": micro_batch_tokens} for p, path in paths.items()}})
    plan = plan_teachers(cfg.teachers, {p: checkpoint_params(c.model_path) for p, c in cfg.teachers.items()},
                         rollout_fraction=0.6, actor_offloaded=True)
    return cfg, paths, plan


"""Driver side of the reward gate: compute ``mopd_kl_mask`` for a step and store it per sample.

Runs once per step on the driver, after rewards are in and before the actor update, over the
whole step batch (GRPO groups are whole only there: the workers shuffle and split micro-batches).
verl 0.9.1's v1 trainer keeps samples in TransferQueue; every stored field reaches the loss
micro-batch, so writing ``mopd_kl_mask`` with ``tq.kv_batch_put`` is all the loss needs.

How gated-off samples count in the token-mean (``mopd.normalization``):

- ``all`` (default): as zeros. The denominator is every response token of the mini-batch, which is
  what verl's engines already all-reduce (``batch_num_tokens``), so this is exact under any
  data/sequence parallelism and micro-batching. The public UI-MOPD release approximates the same
  thing per micro-batch (kept-token mean times the kept row fraction).
- ``kept``: excluded. The kept samples' weight becomes ``N_tokens / N_kept_tokens`` of the step
  batch, which turns verl's all-token denominator into a kept-token one. Exact when the step is one
  mini-batch (``ppo_mini_batch_size == train_batch_size``, as in the UI-MOPD run); with several
  mini-batches each uses the step's kept fraction instead of its own.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from verl_mopd.config import MOPDConfig
from verl_mopd.losses import KL_MASK_KEY, KL_START_KEY, reward_gate, thought_end_index

REWARD_EXTRAS_FIELD = "extra_fields"  # v1 agent loop: extra_fields[i]["reward_extra_info"][name]


def _as_list(values: Any) -> list:
    if isinstance(values, torch.Tensor):
        return values.tolist()
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _padded(values: torch.Tensor, padding=0) -> torch.Tensor:
    return values.to_padded_tensor(padding) if values.is_nested else values


def _gate_metric(cfg: MOPDConfig, data: TensorDict) -> torch.Tensor:
    name = cfg.gate_metric
    if name == "rm_scores":
        return _padded(data["rm_scores"], 0.0).float().reshape(len(data), -1).sum(-1)
    if name in data.keys():
        return torch.as_tensor([float(v) for v in _as_list(data[name])], dtype=torch.float32)
    if REWARD_EXTRAS_FIELD not in data.keys():
        raise KeyError(
            f"mopd.gate_metric={name!r} is neither a stored field nor in extra_fields (the samples have "
            f"{sorted(data.keys())}); use 'rm_scores' or a key the reward function returns"
        )
    extras = _as_list(data[REWARD_EXTRAS_FIELD])
    values = []
    for i, extra in enumerate(extras):
        info = (extra or {}).get("reward_extra_info", {}) if isinstance(extra, dict) else {}
        if name not in info:
            raise KeyError(
                f"mopd.gate_metric={name!r} is not in sample {i}'s reward extras "
                f"(extra_fields.reward_extra_info keys: {sorted(info)}); use 'rm_scores' or a key that "
                "the reward function returns (verl_mopd.rewards.compute_score returns 'acc')"
            )
        values.append(float(info[name]))
    return torch.tensor(values, dtype=torch.float32)


def platform_metrics(data: TensorDict, platform_key: str, gate: torch.Tensor, real: torch.Tensor,
                     response_mask: torch.Tensor) -> dict[str, float]:
    """Per platform: KL-on fraction, mean response length, and (with ``rm_scores``) the mean task
    reward and the fraction of rollouts at each reward level (+1 / -0.5 / -1 for our reward)."""
    platforms = [str(p) for p in _as_list(data[platform_key])]
    lengths = response_mask.sum(-1).float()
    rewards = _padded(data["rm_scores"], 0.0).float().reshape(len(data), -1).sum(-1) if "rm_scores" in data.keys() else None
    metrics: dict[str, float] = {}
    for platform in sorted(set(platforms)):
        rows = torch.tensor([p == platform for p in platforms]) & real
        if not rows.any():
            continue
        metrics[f"mopd/kl_mask_on_fraction/{platform}"] = gate[rows].mean().item()
        metrics[f"mopd/response_length/{platform}"] = lengths[rows].mean().item()
        if rewards is not None:
            r = rewards[rows]
            metrics[f"mopd/reward_mean/{platform}"] = r.mean().item()
            for level in torch.unique(r).tolist():
                metrics[f"mopd/reward_level/{platform}/{level:+g}"] = (r == level).float().mean().item()
    return metrics


def compute_kl_gate(
    cfg: MOPDConfig,
    data: TensorDict,
    *,
    is_padding: list[bool] | None = None,
    think_end_token_id: int | None = None,
    max_response_length: int | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Per-sample gate fields for one step batch (pure; no TransferQueue).

    Args:
        cfg: the ``mopd`` gate block.
        data: (bs,) TensorDict with the group field (``uid``), ``response_mask`` (bs, response_len;
            padded or nested), the gate metric (``rm_scores`` or a reward extra), optionally the
            platform field, and ``responses`` when ``kl_skip_thought``.
        is_padding: per-sample flags of verl's batch padding; padding rows never enter a group mean
            and get weight 0.
        think_end_token_id: id of ``cfg.think_end_token``; required with ``kl_skip_thought``.
        max_response_length: the rollout's response length limit (``rollout.response_length``); with
            ``kl_skip_thought`` a response that reached it without ``</think>`` was cut off inside its
            thought and gets no KL (``losses.thought_end_index``). None: no response counts as cut off.

    Returns:
        ``(fields, metrics)``: ``fields[mopd_kl_mask]`` (bs,) float32 (gate times the normalization
        weight), ``fields[mopd_kl_start]`` (bs,) int64 with ``kl_skip_thought``; ``metrics`` with
        ``mopd/kl_mask_on_fraction``, ``mopd/gate_metric_mean`` and, with the platform field,
        :func:`platform_metrics`.
    """
    n = len(data)
    real = torch.ones(n, dtype=torch.bool) if is_padding is None else ~torch.as_tensor(is_padding, dtype=torch.bool)
    scores = _gate_metric(cfg, data)
    groups = _as_list(data[cfg.group_key])
    gate = torch.zeros(n)
    idx = real.nonzero().squeeze(-1)
    if len(idx):
        gate[idx] = reward_gate(scores[idx], [groups[i] for i in idx.tolist()], cfg.tau_kl)

    fields: dict[str, torch.Tensor] = {}
    response_mask = _padded(data["response_mask"], 0).reshape(n, -1).bool()
    window = response_mask
    if cfg.kl_skip_thought:
        if think_end_token_id is None:
            raise ValueError("mopd.kl_skip_thought=true needs the id of mopd.think_end_token in the tokenizer")
        responses = _padded(data["responses"], 0).reshape(n, -1)
        truncated = None
        if max_response_length is not None:
            truncated = response_mask.sum(-1) >= int(max_response_length)
        start = thought_end_index(responses, response_mask, think_end_token_id, truncated=truncated)
        fields[KL_START_KEY] = start
        window = response_mask & (torch.arange(response_mask.shape[-1]) >= start.unsqueeze(-1))
        thought_cut_fraction = 0.0
        if truncated is not None:
            no_end = ~((responses == think_end_token_id) & response_mask).any(-1)
            thought_cut_fraction = ((truncated & no_end & real).sum() / real.sum().clamp_min(1)).item()

    weight = gate.clone()
    if cfg.normalization == "kept":
        tokens = (response_mask.sum(-1) * real).sum().float()
        kept = (window.sum(-1) * gate).sum().float()
        weight = gate * (tokens / kept) if kept > 0 else torch.zeros(n)
    fields[KL_MASK_KEY] = weight.float()

    metrics = {
        "mopd/kl_mask_on_fraction": gate[real].mean().item() if real.any() else 1.0,
        "mopd/gate_metric_mean": scores[real].mean().item() if real.any() else 0.0,
    }
    if cfg.kl_skip_thought:
        metrics["mopd/thought_cut_off_fraction"] = thought_cut_fraction  # no KL on these (all thought)
    if cfg.routing_key in data.keys():
        metrics.update(platform_metrics(data, cfg.routing_key, gate, real, response_mask))
    return fields, metrics


def write_kl_gate(
    batch,
    cfg: MOPDConfig,
    *,
    tq=None,
    think_end_token_id: int | None = None,
    max_response_length: int | None = None,
) -> dict[str, float]:
    """Compute the gate for a step's samples in TransferQueue and store ``mopd_kl_mask``.

    Args:
        batch: verl's ``KVBatchMeta`` of the step (``keys``, ``tags``, ``partition_id``, ``fields``).
        cfg: the ``mopd`` gate block.
        tq: the TransferQueue client module (default: ``import transfer_queue``); anything with its
            ``kv_batch_get`` / ``kv_batch_put`` calls.
        think_end_token_id, max_response_length: see :func:`compute_kl_gate`.

    Returns:
        the gate metrics, for verl's tracking.
    """
    if tq is None:
        import transfer_queue as tq
    if not cfg.enable:
        return {}
    # TransferQueue skips requested fields a sample does not have, so ask for every candidate
    fields = [cfg.group_key, "response_mask", "rm_scores", cfg.gate_metric]
    if cfg.gate_metric != "rm_scores":
        fields.append(REWARD_EXTRAS_FIELD)  # where the v1 agent loop keeps reward extras
    if cfg.routing_key:
        fields.append(cfg.routing_key)
    if cfg.kl_skip_thought:
        fields.append("responses")
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
    required = [cfg.group_key, "response_mask"] + (["responses"] if cfg.kl_skip_thought else [])
    missing = [f for f in required if f not in data.keys()]
    if missing:
        raise KeyError(f"the reward gate needs stored fields {missing}; the step's samples have {sorted(data.keys())}")
    is_padding = [bool(tag.get("is_padding", False)) for tag in batch.tags] if batch.tags else None
    out, metrics = compute_kl_gate(cfg, data, is_padding=is_padding, think_end_token_id=think_end_token_id,
                                   max_response_length=max_response_length)
    tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(out, batch_size=len(batch.keys)))
    return metrics

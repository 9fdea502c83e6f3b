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
- ``kept``: excluded (and so are the thought tokens with ``kl_skip_thought``). The kept samples'
  stored ``mopd_kl_mask`` becomes ``N_tokens / N_counted_tokens`` of the step batch
  (``verl_mopd.losses.kept_kl_mask``, the one definition; ``mopd_kl_loss`` realizes the same mean
  with its loss mask), which turns verl's all-token denominator into a counted-token one. Exact
  when the step is one mini-batch (``ppo_mini_batch_size == train_batch_size``, as in the UI-MOPD
  run); with several mini-batches each uses the step's kept fraction instead of its own.

Names: the gate is ``kl_mask_B`` (one value per sample; ``mopd_kl_mask`` in the batch), its config
is ``mopd_config`` (the run's ``verl_mopd.config.MOPDConfig``).
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from verl_mopd.config import MOPDConfig
from verl_mopd.losses import KL_MASK_KEY, KL_START_KEY, kept_kl_mask, padded, reward_gate, thought_end_index

REWARD_EXTRAS_FIELD = "extra_fields"  # v1 agent loop: extra_fields[i]["reward_extra_info"][name]


def _as_list(values: Any) -> list:
    if isinstance(values, torch.Tensor):
        return values.tolist()
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _gate_metric(mopd_config: MOPDConfig, data: TensorDict) -> torch.Tensor:
    name = mopd_config.gate_metric
    if name == "rm_scores":
        return padded(data["rm_scores"], 0.0).float().reshape(len(data), -1).sum(-1)
    if name in data.keys():
        return torch.as_tensor([float(v) for v in _as_list(data[name])], dtype=torch.float32)
    if REWARD_EXTRAS_FIELD not in data.keys():
        raise ValueError(
            f"mopd.gate_metric={name!r} is neither a stored field nor in extra_fields (the samples have "
            f"{sorted(data.keys())}); use 'rm_scores' or a key the reward function returns"
        )
    extras = _as_list(data[REWARD_EXTRAS_FIELD])
    values = []
    for i, extra in enumerate(extras):
        info = (extra or {}).get("reward_extra_info", {}) if isinstance(extra, dict) else {}
        if name not in info:
            raise ValueError(
                f"mopd.gate_metric={name!r} is not in sample {i}'s reward extras "
                f"(extra_fields.reward_extra_info keys: {sorted(info)}); use 'rm_scores' or a key that "
                "the reward function returns (verl_mopd.rewards.compute_score returns 'acc')"
            )
        values.append(float(info[name]))
    return torch.tensor(values, dtype=torch.float32)


def platform_metrics(data: TensorDict, routing_key: str, kl_mask_B: torch.Tensor, real_B: torch.Tensor,
                     response_mask_BT: torch.Tensor) -> dict[str, float]:
    """Per platform: KL-on fraction, mean response length, and (with ``rm_scores``) the mean task
    reward and the fraction of rollouts at each reward level (+1 / -0.5 / -1 for our reward)."""
    platforms = [str(p) for p in _as_list(data[routing_key])]
    lengths_B = response_mask_BT.sum(-1).float()
    rewards_B = (padded(data["rm_scores"], 0.0).float().reshape(len(data), -1).sum(-1)
                 if "rm_scores" in data.keys() else None)
    metrics: dict[str, float] = {}
    for platform in sorted(set(platforms)):
        rows_B = torch.tensor([p == platform for p in platforms]) & real_B
        if not rows_B.any():
            continue
        metrics[f"mopd/kl_mask_on_fraction/{platform}"] = kl_mask_B[rows_B].mean().item()
        metrics[f"mopd/response_length/{platform}"] = lengths_B[rows_B].mean().item()
        if rewards_B is not None:
            r = rewards_B[rows_B]
            metrics[f"mopd/reward_mean/{platform}"] = r.mean().item()
            for level in torch.unique(r).tolist():
                metrics[f"mopd/reward_level/{platform}/{level:+g}"] = (r == level).float().mean().item()
    return metrics


def compute_reward_gate(
    mopd_config: MOPDConfig,
    data: TensorDict,
    *,
    is_padding: list[bool] | None = None,
    think_end_token_id: int | None = None,
    max_response_length: int | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Per-sample gate fields for one step batch (pure; no TransferQueue).

    Args:
        mopd_config: the run's ``mopd`` block (its gate fields).
        data: (bs,) TensorDict with the group field (``uid``), ``response_mask`` (bs, response_len;
            padded or nested), the gate metric (``rm_scores`` or a reward extra), optionally the
            platform field, and ``responses`` when ``kl_skip_thought``.
        is_padding: per-sample flags of verl's batch padding; padding rows never enter a group mean
            and get weight 0.
        think_end_token_id: id of ``mopd_config.think_end_token``; required with ``kl_skip_thought``.
        max_response_length: the rollout's response length limit (``rollout.response_length``); with
            ``kl_skip_thought`` a response that reached it without ``</think>`` was cut off inside its
            thought and gets no KL (``losses.thought_end_index``). None: no response counts as cut off.

    Returns:
        ``(fields, metrics)``: ``fields[mopd_kl_mask]`` (bs,) float32 (the gate; with
        ``normalization=kept`` times the weight of ``losses.kept_kl_mask``), ``fields[mopd_kl_start]``
        (bs,) int64 with ``kl_skip_thought``; ``metrics`` with ``mopd/kl_mask_on_fraction``,
        ``mopd/gate_metric_mean`` and, with the platform field, :func:`platform_metrics`.
    """
    n = len(data)
    real_B = torch.ones(n, dtype=torch.bool) if is_padding is None else ~torch.as_tensor(is_padding, dtype=torch.bool)
    scores_B = _gate_metric(mopd_config, data)
    groups = _as_list(data[mopd_config.group_key])
    kl_mask_B = torch.zeros(n)
    idx = real_B.nonzero().squeeze(-1)
    if len(idx):
        kl_mask_B[idx] = reward_gate(scores_B[idx], [groups[i] for i in idx.tolist()], mopd_config.tau_kl)

    fields: dict[str, torch.Tensor] = {}
    response_mask_BT = padded(data["response_mask"], 0).reshape(n, -1).bool()
    kl_start_B = None
    if mopd_config.kl_skip_thought:
        if think_end_token_id is None:
            raise ValueError("mopd.kl_skip_thought=true needs the id of mopd.think_end_token in the tokenizer")
        responses_BT = padded(data["responses"], 0).reshape(n, -1)
        truncated_B = None
        if max_response_length is not None:
            truncated_B = response_mask_BT.sum(-1) >= int(max_response_length)
        kl_start_B = thought_end_index(responses_BT, response_mask_BT, think_end_token_id, truncated=truncated_B)
        fields[KL_START_KEY] = kl_start_B
        thought_cut_fraction = 0.0
        if truncated_B is not None:
            no_end_B = ~((responses_BT == think_end_token_id) & response_mask_BT).any(-1)
            thought_cut_fraction = ((truncated_B & no_end_B & real_B).sum() / real_B.sum().clamp_min(1)).item()

    stored_B = kl_mask_B.clone()
    if mopd_config.normalization == "kept":
        stored_B = kept_kl_mask(kl_mask_B, response_mask_BT, kl_start_B, real_B)
    fields[KL_MASK_KEY] = stored_B.float()

    metrics = {
        "mopd/kl_mask_on_fraction": kl_mask_B[real_B].mean().item() if real_B.any() else 1.0,
        "mopd/gate_metric_mean": scores_B[real_B].mean().item() if real_B.any() else 0.0,
    }
    if mopd_config.kl_skip_thought:
        metrics["mopd/thought_cut_off_fraction"] = thought_cut_fraction  # no KL on these (all thought)
    if mopd_config.routing_key in data.keys():
        metrics.update(platform_metrics(data, mopd_config.routing_key, kl_mask_B, real_B, response_mask_BT))
    return fields, metrics


def write_reward_gate(
    batch,
    mopd_config: MOPDConfig,
    *,
    tq=None,
    think_end_token_id: int | None = None,
    max_response_length: int | None = None,
) -> dict[str, float]:
    """Compute the gate for a step's samples in TransferQueue and store ``mopd_kl_mask``.

    Args:
        batch: verl's ``KVBatchMeta`` of the step (``keys``, ``tags``, ``partition_id``, ``fields``).
        mopd_config: the run's ``mopd`` block (its gate fields).
        tq: the TransferQueue client module (default: ``import transfer_queue``); anything with its
            ``kv_batch_get`` / ``kv_batch_put`` calls.
        think_end_token_id, max_response_length: see :func:`compute_reward_gate`.

    Returns:
        the gate metrics, for verl's tracking.
    """
    if tq is None:
        import transfer_queue as tq
    if not mopd_config.enable:
        return {}
    # TransferQueue skips requested fields a sample does not have, so ask for every candidate
    fields = [mopd_config.group_key, "response_mask", "rm_scores", mopd_config.gate_metric]
    if mopd_config.gate_metric != "rm_scores":
        fields.append(REWARD_EXTRAS_FIELD)  # where the v1 agent loop keeps reward extras
    if mopd_config.routing_key:
        fields.append(mopd_config.routing_key)
    if mopd_config.kl_skip_thought:
        fields.append("responses")
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
    required = [mopd_config.group_key, "response_mask"] + (["responses"] if mopd_config.kl_skip_thought else [])
    missing = [f for f in required if f not in data.keys()]
    if missing:
        raise ValueError(f"the reward gate needs stored fields {missing}; the step's samples have {sorted(data.keys())}")
    is_padding = [bool(tag.get("is_padding", False)) for tag in batch.tags] if batch.tags else None
    out, metrics = compute_reward_gate(mopd_config, data, is_padding=is_padding, think_end_token_id=think_end_token_id,
                                       max_response_length=max_response_length)
    tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(out, batch_size=len(batch.keys)))
    return metrics

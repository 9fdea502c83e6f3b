"""GRPO group verdicts: mixed-outcome filter and environment-failure masking (MintAct §3.4.2).

A GRPO group (verl's ``uid``) is *valid* when the scores of its usable samples are not all
equal. A sample is unusable when its environment failed (a crashed emulator, a lost VM): its
score is a false negative, so it must not enter the group mean/std nor any loss term. A group
left with fewer than ``min_valid`` usable samples is dropped.

Distillation changes what a useless group is: an all-equal group gives no policy-gradient
signal, but still carries teacher signal (an all-failure group is where the teacher helps
most). ``uniform_groups="kl_only"`` keeps such groups with advantage 0 (the KL term only).

Reuses verl: ``verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage`` computes the
group statistics on the usable rows; the uniform test is the one of verl's DAPO filter
(``ReplayBuffer._dapo_filtered_keys``: std of the metric == 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

UNIFORM_GROUP_MODES = ("drop", "kl_only")

# Group verdicts. The first two are kept, the last three are dropped.
MIXED = "mixed"
KL_ONLY = "kl_only"
DROPPED_UNIFORM = "dropped_uniform"
DROPPED_TOO_FEW_VALID = "dropped_too_few_valid"
KEPT_VERDICTS = (MIXED, KL_ONLY)


@dataclass(frozen=True)
class GroupVerdict:
    """What happens to one GRPO group.

    kind: ``"mixed"`` | ``"kl_only"`` | ``"dropped_uniform"`` | ``"dropped_too_few_valid"``.
    num_valid / num_env_failures: usable and env-failed samples of the group.
    shared_value: the common score of a uniform group (None otherwise).
    """

    kind: str
    num_valid: int
    num_env_failures: int
    shared_value: float | None = None

    @property
    def kept(self) -> bool:
        return self.kind in KEPT_VERDICTS


def classify_group(
    scores: Sequence[float],
    env_failed: Sequence[bool],
    *,
    uniform_groups: str = "drop",
    kl_only_max_score: float | None = None,
    min_valid: int = 2,
) -> GroupVerdict:
    """Classify one group from its per-sample scores and env-failure flags.

    Args:
        scores: (n,) the filter metric of each sample (verl: ``rm_scores`` sum or a
            ``reward_extra_info`` field).
        env_failed: (n,) True where the environment failed for that sample.
        uniform_groups: ``"drop"`` (DAPO) or ``"kl_only"`` (keep with advantage 0).
        kl_only_max_score: with ``"kl_only"``, uniform groups whose shared score is above this
            are still dropped (e.g. all-success groups whose KL the MOPD gate switches off).
        min_valid: groups with fewer usable samples are dropped.
    """
    if len(scores) != len(env_failed):
        raise ValueError(f"scores has {len(scores)} entries but env_failed has {len(env_failed)}")
    if uniform_groups not in UNIFORM_GROUP_MODES:
        raise ValueError(f"uniform_groups={uniform_groups!r}; allowed: {UNIFORM_GROUP_MODES}")
    valid = [float(s) for s, failed in zip(scores, env_failed, strict=True) if not failed]
    n_fail = len(scores) - len(valid)
    if len(valid) < min_valid:
        return GroupVerdict(DROPPED_TOO_FEW_VALID, len(valid), n_fail)
    if float(np.std(valid)) != 0.0:
        return GroupVerdict(MIXED, len(valid), n_fail)
    shared = valid[0]
    keep = uniform_groups == "kl_only" and (kl_only_max_score is None or shared <= kl_only_max_score)
    return GroupVerdict(KL_ONLY if keep else DROPPED_UNIFORM, len(valid), n_fail, shared)


def _truthy(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return bool(value.reshape(-1)[0].item()) if value.numel() else False
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes")
    return bool(value)


def read_env_failure(
    extra_fields: Mapping[str, Any] | None,
    extra_info: Mapping[str, Any] | None,
    key: str = "env_failure",
) -> bool:
    """Whether a stored trajectory is flagged as an environment failure.

    Looked up, first hit wins: ``extra_fields["reward_extra_info"][key]`` (what the reward
    function returned), ``extra_fields[key]`` (what the agent loop recorded),
    ``extra_info[key]`` (the dataset / environment's ``extra_info``). Missing means False.
    """
    extra_fields = extra_fields or {}
    reward_extra_info = extra_fields.get("reward_extra_info") or {}
    for source in (reward_extra_info, extra_fields, extra_info or {}):
        if key in source and source[key] is not None:
            return _truthy(source[key])
    return False

"""Heterogeneous batch control (MintAct): group verdicts, env-failure masking, per-domain quotas.

``groups`` and ``quota`` are pure; ``sampler`` (verl's v1 ReplayBuffer subclasses) imports verl's
trainer package and TransferQueue, so it is not imported here.
"""

from .groups import GroupVerdict, classify_group, read_env_failure
from .quota import Decision, QuotaConfig, QuotaScheduler

__all__ = [
    "Decision",
    "GroupVerdict",
    "QuotaConfig",
    "QuotaScheduler",
    "classify_group",
    "read_env_failure",
]

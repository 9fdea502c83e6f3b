"""verl 0.9.1 v1 custom samplers: per-domain quotas, group verdicts and env-failure masking.

Select with ``trainer.v1.sampler.custom_sampler.{path,name}``:
``pkg://verl_mopd.batching.sampler`` + ``QuotaReplayBuffer`` (``trainer_mode=sync``) or
``QuotaReplayBufferAsync`` (``separate_async`` / ``colocate_async``); configure with
``trainer.v1.sampler.sampler_kwargs`` (``BatchingConfig``).

Reuses verl's ``ReplayBuffer`` / ``ReplayBufferAsync`` (``verl/trainer/ppo/v1/replay_buffer.py``):
TransferQueue metadata sync, terminal-group eviction and its metrics, off-policy staleness
(async), the DAPO refill path (``_dapo_filtered_keys`` is overridden so that the uniform test
runs on env-valid samples only and also drops groups left with < ``min_valid_samples``), and
batch materialization. Added: the ``QuotaScheduler`` decides which groups form a batch, and
env-failed trajectories are cleared from TransferQueue instead of entering the batch, so verl's
own GRPO (``compute_advantage_for_multi_trajectories``) computes each group's mean/std on the
usable samples and no loss term sees the failed ones.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

import transfer_queue as tq
from omegaconf import DictConfig, OmegaConf
from transfer_queue import KVBatchMeta

from verl.base_config import BaseConfig
from verl.trainer.ppo.v1.replay_buffer import (
    FILTER_GROUPS_REWARD_METRIC,
    ReplayBuffer,
    ReplayBufferAsync,
    _accumulate_eviction_metrics,
)
from verl.utils.skip import SkipManager

from verl_mopd.errors import ConfigError
from verl_mopd.files import atomic_write

from .groups import KL_ONLY, MIXED, UNIFORM_GROUP_MODES, GroupVerdict, classify_group, read_env_failure
from .quota import QuotaConfig, QuotaScheduler

STATE_FILE = "batching_state.json"

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class BatchingConfig(BaseConfig):
    """``trainer.v1.sampler.sampler_kwargs`` of the quota samplers.

    Args:
        quota: the ``QuotaConfig`` block.
        domain_key: stored per-sample field naming the domain (the dataset's top-level column).
        filter_metric: group-filter metric: ``"reward"`` (``rm_scores``, verl's canonical reward)
            or a ``reward_extra_info`` key such as ``"acc"``; as ``algorithm.filter_groups.metric``.
        uniform_groups: ``"drop"`` (DAPO: all-equal groups are evicted and refilled) or
            ``"kl_only"`` (kept with GRPO advantage 0, for the distillation term only, counted
            apart). Default ``"drop"``: it is what MintAct and verl's filter do; choose
            ``"kl_only"`` with ``kl_only_max_score`` = the MOPD gate's ``tau_kl`` to keep the
            all-failure groups, where the teacher helps most.
        kl_only_max_score: with ``"kl_only"``, uniform groups scoring above this are dropped.
        env_failure_key: flag looked up in ``reward_extra_info``, ``extra_fields``, ``extra_info``.
        min_valid_samples: groups with fewer env-valid samples are dropped.
        train_batch_size: prompts per sync batch (``${data.train_batch_size}``); bounds the
            sync trainer's in-flight refills together with ``max_inflight_gen_batches``.
        max_inflight_gen_batches: sync only, as ``algorithm.filter_groups.max_inflight_gen_batches``.
        max_empty_refills: a refill after which no new prompt is in TransferQueue is empty; after
            each empty refill in a row the sampler waits (``poll_interval`` doubled each time, at
            most ``refill_backoff_max_seconds``), and at this many in a row it stops with a
            ``RuntimeError`` instead of polling for ever (verl's own refill always adds prompts).
        refill_backoff_max_seconds: the longest of those waits.
    """

    quota: QuotaConfig = field(default_factory=lambda: QuotaConfig(shares={"desktop": 0.5, "mobile": 0.5}))
    domain_key: str = "platform"
    filter_metric: str = FILTER_GROUPS_REWARD_METRIC
    uniform_groups: str = "drop"
    kl_only_max_score: float | None = None
    env_failure_key: str = "env_failure"
    min_valid_samples: int = 2
    train_batch_size: int | None = None
    max_inflight_gen_batches: int = 1
    max_empty_refills: int = 8
    refill_backoff_max_seconds: float = 30.0

    def __post_init__(self):
        errors = []
        if self.uniform_groups not in UNIFORM_GROUP_MODES:
            errors.append(f"uniform_groups={self.uniform_groups!r}; allowed: {list(UNIFORM_GROUP_MODES)}")
        if self.kl_only_max_score is not None and self.uniform_groups != "kl_only":
            errors.append("kl_only_max_score is set but uniform_groups is not 'kl_only'; unset it or switch")
        for name in ("domain_key", "filter_metric", "env_failure_key"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                errors.append(f"{name}={getattr(self, name)!r}; must be a non-empty string")
        if not isinstance(self.min_valid_samples, int) or self.min_valid_samples < 2:
            errors.append(f"min_valid_samples={self.min_valid_samples!r}; must be an int >= 2 (GRPO needs a std)")
        if self.train_batch_size is not None and (
            not isinstance(self.train_batch_size, int) or self.train_batch_size <= 0
        ):
            errors.append(f"train_batch_size={self.train_batch_size!r}; must be a positive int")
        if not isinstance(self.max_inflight_gen_batches, int) or self.max_inflight_gen_batches <= 0:
            errors.append(f"max_inflight_gen_batches={self.max_inflight_gen_batches!r}; must be a positive int")
        if isinstance(self.max_empty_refills, bool) or not isinstance(self.max_empty_refills, int) \
                or self.max_empty_refills < 1:
            errors.append(f"max_empty_refills={self.max_empty_refills!r}; must be an int >= 1")
        backoff = self.refill_backoff_max_seconds
        if isinstance(backoff, bool) or not isinstance(backoff, int | float) or not 0 <= backoff < float("inf"):
            errors.append(f"refill_backoff_max_seconds={backoff!r}; must be a finite number >= 0")
        if errors:
            raise ConfigError(errors, "trainer.v1.sampler.sampler_kwargs")

    @classmethod
    def from_sampler_kwargs(cls, sampler_kwargs: Mapping | DictConfig | None) -> BatchingConfig:
        """Build from verl's ``sampler_kwargs`` (DictConfig or dict); unknown keys are an error."""
        raw = OmegaConf.to_container(sampler_kwargs, resolve=True) if isinstance(sampler_kwargs, DictConfig) else {}
        if not isinstance(sampler_kwargs, DictConfig):
            raw = dict(sampler_kwargs or {})
        allowed = {f for f in cls.__dataclass_fields__ if not f.startswith("_")}
        unknown = sorted(set(raw) - allowed)
        if unknown:
            raise ConfigError([f"unknown keys {unknown}; allowed: {sorted(allowed)}"], "trainer.v1.sampler.sampler_kwargs")
        if "quota" in raw:
            quota = raw["quota"]
            raw["quota"] = quota if isinstance(quota, QuotaConfig) else QuotaConfig(**dict(quota))
        return cls(**raw)


@dataclass
class _GroupInfo:
    domain: str
    verdict: GroupVerdict
    failed_keys: tuple[str, ...]


def _plain(value):
    return getattr(value, "data", value)


class _QuotaSamplingMixin:
    """Shared by the sync and async quota samplers; see the module docstring."""

    def __init__(
        self,
        trainer_mode: str,
        trainer_config: DictConfig,
        max_off_policy_threshold: int | None,
        max_off_policy_strategy: str,
        sampler_kwargs: DictConfig,
        poll_interval: float = 2.0,
        refill_fn=None,
        clock=time.monotonic,
    ):
        self.batching = BatchingConfig.from_sampler_kwargs(sampler_kwargs)
        super().__init__(
            trainer_mode=trainer_mode,
            trainer_config=trainer_config,
            max_off_policy_threshold=max_off_policy_threshold,
            max_off_policy_strategy=max_off_policy_strategy,
            sampler_kwargs=sampler_kwargs,
            poll_interval=poll_interval,
            refill_fn=refill_fn,
            filter_groups_metric=self.batching.filter_metric,
            train_batch_size=self.batching.train_batch_size,
            gen_batch_size=1,
            max_inflight_gen_batches=self.batching.max_inflight_gen_batches,
        )
        self.scheduler = QuotaScheduler(self.batching.quota)
        self._clock = clock
        self._group_info: dict[str, _GroupInfo] = {}
        self._step_counts: Counter = Counter()
        self._empty_refills = 0  # refills in a row after which TransferQueue held no new prompt
        self._empty_refill_wait = 0.0
        self._refill_probe: frozenset[str] | None = None  # the prompts known when the last refill was asked
        if self.refill_fn is not None:
            self.refill_fn = self._watched_refill(self.refill_fn)

    # -------------------------------------------------------------- refills
    def _prompt_uids(self) -> frozenset[str]:
        return frozenset(uid for steps in self.prompt_global_steps.values() for uid in steps)

    def _watched_refill(self, refill_fn):
        """``refill_fn`` that remembers which prompts existed when it was called; the next metadata
        sync compares (:meth:`_sync_metadata_from_transfer_queue`)."""

        @functools.wraps(refill_fn)
        def refill(num_prompts: int):
            if self._refill_probe is None:
                self._refill_probe = self._prompt_uids()
            return refill_fn(num_prompts)

        refill.unwatched = refill_fn
        return refill

    def _sync_metadata_from_transfer_queue(self):
        """verl's sync, then the empty-refill check: a refill after which TransferQueue holds no prompt
        it did not hold before yielded nothing. The sampler then waits (``poll_interval``, doubled per
        empty refill in a row, at most ``refill_backoff_max_seconds``) instead of asking again at once,
        and stops after ``max_empty_refills`` in a row with a message (verl's own refill, the trainer's
        ``_add_prompts_to_generate``, always registers its prompts before it returns)."""
        super()._sync_metadata_from_transfer_queue()
        probe, self._refill_probe = self._refill_probe, None
        if probe is None:
            return
        if self._prompt_uids() - probe:
            self._empty_refills, self._empty_refill_wait = 0, 0.0
            return
        self._empty_refills += 1
        limit = self.batching.max_empty_refills
        if self._empty_refills >= limit:
            fn = getattr(self.refill_fn, "unwatched", self.refill_fn)
            name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
            progress = {d: f"{a}/{q}" for d, (a, q) in self.scheduler.progress().items()}
            self._empty_refills, self._empty_refill_wait = 0, 0.0
            raise RuntimeError(
                f"the quota sampler's refill yielded no prompt {limit} times in a row "
                f"(trainer.v1.sampler.sampler_kwargs.max_empty_refills={limit}): after each call of the refill "
                f"function {name} TransferQueue held no new prompt, and nothing was in flight to wait for "
                f"(accepted/quota groups per domain: {progress}). verl's refill (_add_prompts_to_generate) always "
                "registers the prompts it draws; a custom trainer's refill must too. Raise max_empty_refills "
                "to wait longer"
            )
        wait = min(self.batching.refill_backoff_max_seconds, self.poll_interval * 2 ** (self._empty_refills - 1))
        if self._empty_refills == 1:
            logger.warning("quota sampler: the refill yielded no prompt; backing off (at most %d times in a row)", limit)
        self._empty_refill_wait += wait
        time.sleep(wait)
        super()._sync_metadata_from_transfer_queue()  # the state after the wait

    # ------------------------------------------------------------ verdicts
    def _classify_uids(self, partition_id: str, uids: set[str]) -> None:
        """Read metric, env-failure flag and domain of each session's final output; one verdict per uid."""
        keys = sorted(k for k in self.partitions[partition_id] if k.split("_")[0] in uids)
        use_reward = self.filter_groups_metric == FILTER_GROUPS_REWARD_METRIC
        required = (["rm_scores"] if use_reward else []) + [self.batching.domain_key]
        data = self._fetch_fields(partition_id, keys, required, optional=("extra_fields", "extra_info"))
        # uid -> session -> [(output index, key, extra_fields, extra_info, domain, rm_scores)]
        sessions: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        for i, key in enumerate(keys):
            uid, session, index = key.rsplit("_", 2)
            sessions[uid][session].append(
                (
                    int(index),
                    key,
                    data["extra_fields"][i] or {},
                    data["extra_info"][i] or {},
                    _plain(data[self.batching.domain_key][i]),
                    data["rm_scores"][i] if use_reward else None,
                )
            )
        for uid in uids:
            scores, failed, failed_keys, domains = [], [], [], set()
            for entries in sessions.get(uid, {}).values():
                # GRPO scores a session by its final output (verl's compute_advantage_for_multi_trajectories).
                _, _, extra_fields, _, _, rm = max(entries, key=lambda e: e[0])
                domains.update(e[4] for e in entries)
                is_failed = any(read_env_failure(e[2], e[3], self.batching.env_failure_key) for e in entries)
                if use_reward:
                    score = float(rm.sum().item())
                else:
                    rei = extra_fields.get("reward_extra_info", {}) or {}
                    if self.filter_groups_metric not in rei:
                        raise RuntimeError(
                            f"group {uid} is missing filter metric {self.filter_groups_metric!r} in "
                            f"reward_extra_info (has {sorted(rei)})"
                        )
                    score = float(rei[self.filter_groups_metric])
                scores.append(score)
                failed.append(is_failed)
                if is_failed:
                    failed_keys.extend(e[1] for e in entries)
            if len(domains) > 1:
                raise RuntimeError(f"group {uid} mixes domains {sorted(map(str, domains))} in {self.batching.domain_key!r}")
            domain = str(next(iter(domains))) if domains else None
            if domain is not None and domain not in self.scheduler.domains:
                raise ValueError(
                    f"{self.batching.domain_key}={domain!r} (group {uid}) has no quota; "
                    f"quota.shares covers {self.scheduler.domains}"
                )
            verdict = classify_group(
                scores,
                failed,
                uniform_groups=self.batching.uniform_groups,
                kl_only_max_score=self.batching.kl_only_max_score,
                min_valid=self.batching.min_valid_samples,
            )
            self._group_info[uid] = _GroupInfo(domain, verdict, tuple(failed_keys))
            self._count_verdict(domain, verdict)

    #: what each field the sampler reads is for (the error names it)
    _FIELD_USES = {
        "rm_scores": "the group filter's metric (sampler_kwargs.filter_metric='reward' reads verl's task score "
                     "rm_scores, written by the reward step before sampling); or set filter_metric to a "
                     "reward_extra_info key such as 'acc'",
    }

    def _fetch_fields(self, partition_id: str, keys: list[str], required: list[str],
                      optional: tuple[str, ...]) -> dict[str, list]:
        """``{field: one value per key}`` from TransferQueue.

        TransferQueue leaves a field out of the whole answer when any one of the keys lacks it (measured
        with verl 0.9.1's TransferQueue). A missing ``required`` field is a ``ValueError`` that names the
        field, a trajectory without it and what is allowed; an ``optional`` one (``extra_fields``,
        ``extra_info``: where the env-failure flag may be) is then read key by key, None where absent."""
        if not keys:
            return {name: [] for name in (*required, *optional)}
        data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=[*required, *optional])
        present = set(data.keys()) if data is not None else set()
        columns: dict[str, list] = {}
        for name in required:
            if name not in present:
                raise ValueError(self._missing_field_message(partition_id, keys, name))
            columns[name] = data[name]
        for name in optional:
            if name in present:
                columns[name] = [_plain(data[name][i]) for i in range(len(keys))]
            else:
                columns[name] = [self._field_of(partition_id, key, name) for key in keys]
        return columns

    @staticmethod
    def _field_of(partition_id: str, key: str, name: str):
        data = tq.kv_batch_get(keys=[key], partition_id=partition_id, select_fields=[name])
        return _plain(data[name][0]) if data is not None and name in data.keys() else None

    def _missing_field_message(self, partition_id: str, keys: list[str], name: str) -> str:
        lacking = [key for key in keys if self._field_of(partition_id, key, name) is None]
        sample = lacking[0] if lacking else keys[0]
        count = f"{len(lacking)} of {len(keys)} trajectories" if lacking else "the trajectories"
        if name == self.batching.domain_key:
            use = (f"the quota sampler reads each trajectory's domain from trainer.v1.sampler.sampler_kwargs."
                   f"domain_key={name!r} (a top-level dataset column; the recipes set it to ${{mopd.routing_key}}); "
                   f"give every row a {name!r} column with one of {self.scheduler.domains} (quota.shares), as "
                   "verl-mopd prepare writes it, or set domain_key to the column that holds the domain")
        else:
            use = self._FIELD_USES.get(name, "the quota sampler reads it")
        return (f"trajectory {sample!r} (group {sample.split('_')[0]}, partition {partition_id!r}) has no field "
                f"{name!r} in TransferQueue ({count} lack it): {use}")

    def _count_verdict(self, domain: str | None, verdict: GroupVerdict) -> None:
        d = domain or "unknown"
        self._step_counts[f"batching/{d}/groups_finished"] += 1
        self._step_counts[f"batching/{d}/groups_{verdict.kind}"] += 1
        self._step_counts["batching/env_failure/samples"] += verdict.num_env_failures
        self._step_counts[f"batching/{d}/env_failure_samples"] += verdict.num_env_failures
        if domain is not None and not verdict.kept:
            self.scheduler.note_finished(domain)

    def _dapo_filtered_keys(self, partition_id: str) -> tuple[set[str], Counter]:
        """Groups to evict (and refill through verl's DAPO path): uniform groups (unless kept for KL)
        and groups with fewer than ``min_valid_samples`` env-valid samples; plus verl's diagnostic
        ``{shared value: count}`` for the uniform ones."""
        if partition_id == "val":
            return set(), Counter()
        terminal = self.finished_keys[partition_id] | self.failure_keys[partition_id]
        for uid in self._group_info.keys() - terminal:
            del self._group_info[uid]
        new = terminal - self._group_info.keys()
        if new:
            self._classify_uids(partition_id, new)
        dropped = {uid for uid in terminal if not self._group_info[uid].verdict.kept}
        shared = Counter(
            self._group_info[uid].verdict.shared_value
            for uid in dropped
            if self._group_info[uid].verdict.shared_value is not None
        )
        return dropped, shared

    def _terminal_eviction_reasons(self, global_steps: int, partition_id: str):
        stale, dropped, failed, counts = super()._terminal_eviction_reasons(global_steps, partition_id)
        return stale, dropped, failed - dropped, counts

    # -------------------------------------------------------------- quotas
    def _offer(self, partition_id: str, sampleable: set[str]) -> int:
        """Hand newly sampleable kept groups to the scheduler (oldest first); forget vanished ones.
        Returns how many new groups arrived for a domain that already covers its quota."""
        for gid in [g for g in self.scheduler._domain_of if g not in sampleable]:
            self.scheduler.remove(gid)
        steps = self.prompt_global_steps[partition_id]
        new = sorted(
            (uid for uid in sampleable if uid not in self.scheduler._domain_of),
            key=lambda uid: (steps.get(uid, 0), uid),
        )
        surplus = 0
        for uid in new:
            info = self._group_info[uid]
            surplus += int(self.scheduler.can_fill(info.domain))
            self.scheduler.add(uid, info.domain)
        return surplus

    def paused_domains(self) -> frozenset[str]:
        """Domains whose producers should pause (read by the trainer's refill hook)."""
        return self.scheduler.paused_domains()

    def _batch_metrics(self, selected: list[str]) -> dict:
        last = self.scheduler.last_batch or {}
        n = max(1, len(selected))
        metrics: dict = {}
        for d in self.scheduler.domains:
            kinds = Counter(self._group_info[uid].verdict.kind for uid in selected if self._group_info[uid].domain == d)
            accepted = kinds[MIXED] + kinds[KL_ONLY]
            metrics[f"batching/{d}/accepted_share"] = accepted / n
            metrics[f"batching/{d}/accepted_valid_groups"] = kinds[MIXED]
            metrics[f"batching/{d}/accepted_kl_only_groups"] = kinds[KL_ONLY]
            metrics[f"batching/{d}/quota"] = last.get("quotas", {}).get(d, 0)
            finished = self._step_counts.get(f"batching/{d}/groups_finished", 0)
            if finished:
                metrics[f"batching/{d}/valid_group_rate"] = self._step_counts[f"batching/{d}/groups_{MIXED}"] / finished
        metrics["batching/fallback_slots"] = last.get("fallback_slots", 0)
        metrics["batching/fallback_slots_cum"] = self.scheduler.fallback_slots_total
        metrics["batching/fallback_batches_cum"] = self.scheduler.fallback_batches_total
        metrics.update({k: v for k, v in self._step_counts.items()})
        self._step_counts = Counter()
        return metrics

    def _materialize_batch(
        self, partition_id: str, selected_prompt_uids: list[str], partition_snapshot: dict[str, dict]
    ) -> KVBatchMeta:
        """verl's materialization minus env-failed trajectories (cleared from TransferQueue)."""
        if partition_id == "val":
            return super()._materialize_batch(partition_id, selected_prompt_uids, partition_snapshot)
        self.last_batch_metrics = self._batch_metrics(selected_prompt_uids)
        failed = {k for uid in selected_prompt_uids for k in self._group_info[uid].failed_keys}
        if failed:
            tq.kv_clear(partition_id=partition_id, keys=sorted(failed))
        snapshot = {k: v for k, v in partition_snapshot.items() if k not in failed}
        batch = super()._materialize_batch(partition_id, selected_prompt_uids, snapshot)
        self.last_batch_metrics["batching/env_failure/masked_samples"] = len(failed)
        for uid in selected_prompt_uids:
            self._group_info.pop(uid, None)
        return batch

    # ---------------------------------------------------------- checkpoint
    def state_dict(self) -> dict:
        return {"scheduler": self.scheduler.state_dict(), "batching": {"uniform_groups": self.batching.uniform_groups}}

    def load_state_dict(self, state: Mapping) -> None:
        self.scheduler.load_state_dict(state["scheduler"])

    def save_checkpoint(self, global_step_folder: str) -> str:
        """Write ``batching_state.json`` into verl's ``global_step_N`` folder (atomically: a failed
        save leaves the previous file whole); returns its path."""
        os.makedirs(global_step_folder, exist_ok=True)
        path = os.path.join(global_step_folder, STATE_FILE)
        text = json.dumps(self.state_dict(), indent=1, sort_keys=True, allow_nan=False)
        with atomic_write(path) as f:
            f.write(text)
        return path

    def load_checkpoint(self, global_step_folder: str) -> bool:
        """Restore from ``global_step_N/batching_state.json``; False (and nothing changed) if absent.
        A torn or malformed file is a ValueError that names it and the field."""
        path = os.path.join(global_step_folder, STATE_FILE)
        if not os.path.exists(path):
            return False
        try:
            with open(path, encoding="utf-8") as f:
                state = json.load(f)
            if not isinstance(state, Mapping) or not isinstance(state.get("scheduler"), Mapping):
                raise ValueError("expected an object with a 'scheduler' object")
            self.load_state_dict(state)
        except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
            raise ValueError(
                f"{path}: cannot resume the quota sampler: {e}. Delete the file to start its counters afresh"
            ) from None
        return True


class QuotaReplayBuffer(_QuotaSamplingMixin, ReplayBuffer):
    """Sync trainer (``trainer.v1.trainer_mode=sync``): bufferless like verl's sync DAPO.

    Refill credit as verl's: 2 per evicted group; plus 1 per valid group of a domain that
    already covers its quota (it needs a replacement from a short domain). Once the batch is
    complete, in-flight requests are drained and the surplus discarded (counted).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.batching.train_batch_size is None:
            raise ValueError(
                "trainer.v1.sampler.sampler_kwargs.train_batch_size is required for the sync quota sampler; "
                "set it to ${data.train_batch_size}"
            )

    @SkipManager.annotate_tq(role="rollout_tq", phase="sample")
    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        if partition_id == "val":
            return ReplayBuffer.sample(self, global_steps, partition_id, batch_size)
        self.scheduler.start_batch(batch_size, self._clock())
        eviction_metrics: dict = {}
        refill_credit, draining = 0, False
        max_inflight = self.max_inflight_gen_batches * self.train_batch_size
        last_debug_time = time.time()
        while True:
            self._sync_metadata_from_transfer_queue()
            reasons = self._terminal_eviction_reasons(global_steps, partition_id)
            evicted, stale_count, dropped_count, metrics = self._evict_terminal_groups(
                global_steps, partition_id, reasons
            )
            if evicted:
                _accumulate_eviction_metrics(eviction_metrics, metrics, stale_count)
            sampleable = self._sampleable_terminal_keys(partition_id, reasons)
            surplus = self._offer(partition_id, sampleable)
            decision = self.scheduler.poll(self._clock())
            inflight = len(self.pending_keys[partition_id]) + len(self.running_keys[partition_id])
            if decision.batch is not None:
                draining, refill_credit = True, 0
            elif not draining:
                refill_credit += 2 * dropped_count + surplus
                if inflight == 0 and refill_credit == 0:
                    refill_credit = 1  # nothing left to wait for: keep producing until the bound fires
            if not draining and refill_credit > 0:
                dispatch = min(refill_credit, max(0, max_inflight - inflight))
                if dispatch > 0:
                    self.refill_fn(dispatch)
                    refill_credit -= dispatch
                    continue
            if decision.batch is not None and inflight == 0:
                break
            last_debug_time = self._wait_for_next_poll(partition_id, last_debug_time)

        selected = decision.batch
        partition_snapshot = dict(self.partitions[partition_id])
        self.scheduler.drain()
        surplus_uids = sampleable - set(selected)
        if surplus_uids:
            self._clear_groups(partition_id, surplus_uids)
            key = f"{self._metrics_prefix(partition_id)}/filter_groups/discarded_surplus_samples"
            eviction_metrics[key] = eviction_metrics.get(key, 0) + len(surplus_uids)
            for uid in surplus_uids:
                self._group_info.pop(uid, None)
        batch = self._materialize_batch(partition_id, selected, partition_snapshot)
        eviction_metrics.update(self.last_batch_metrics)
        return batch, eviction_metrics


class QuotaReplayBufferAsync(_QuotaSamplingMixin, ReplayBufferAsync):
    """``separate_async`` / ``colocate_async``: groups beyond a domain's quota stay buffered for
    later batches; verl's staleness control still evicts them when they grow too old."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._sampling = False

    def _has_enough_samples(self, global_steps, partition_id, batch_size, sampleable_keys) -> bool:
        # target 0: only verl's dropless-wait check (in-flight prompts at the staleness limit).
        if not super()._has_enough_samples(global_steps, partition_id, 0, sampleable_keys):
            return False
        if not self._sampling or partition_id == "val":
            return len(sampleable_keys) >= batch_size
        self._offer(partition_id, sampleable_keys)
        if self.scheduler.poll(self._clock()).batch is not None:
            return True
        inflight = len(self.pending_keys[partition_id]) + len(self.running_keys[partition_id])
        if inflight == 0 and self.refill_fn is not None:
            # Nothing left in flight can fill the short domains: produce their free slots again.
            missing = sum(max(0, q - a) for a, q in self.scheduler.progress().values())
            self.refill_fn(max(1, missing))
        return False

    def _select_prompt_uids(self, partition_id, sampleable_keys, batch_size):
        if not self._sampling or partition_id == "val":
            return super()._select_prompt_uids(partition_id, sampleable_keys, batch_size)
        _, partition_snapshot, steps_snapshot = super()._select_prompt_uids(partition_id, sampleable_keys, 0)
        selected = self.scheduler.poll(self._clock()).batch
        return list(selected), partition_snapshot, steps_snapshot

    @SkipManager.annotate_tq(role="rollout_tq", phase="sample")
    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        if partition_id == "val":
            return ReplayBufferAsync.sample(self, global_steps, partition_id, batch_size)
        self.scheduler.start_batch(batch_size, self._clock())
        self._sampling = True
        try:
            batch, metrics = ReplayBufferAsync.sample.__wrapped__(self, global_steps, partition_id, batch_size)
        finally:
            self._sampling = False
        metrics.update(self.last_batch_metrics)
        return batch, metrics

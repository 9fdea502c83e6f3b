"""Per-domain quota on valid-group consumption, backpressure, bounded-wait fallback (MintAct §3.4.2-3).

Filtering out all-success / all-failure groups makes each domain's share of the optimizer's
batch depend on its rollout throughput times its mixed-outcome rate, not on the sampler's
input mix. ``QuotaScheduler`` fixes the mix where groups are *consumed*: every batch of
``batch_size`` groups gets an integer quota per domain; a domain's groups beyond its quota
wait in the buffer (its producers are told to pause); when some domain is full and another
is short for longer than the bound (``max_wait_groups`` groups finished meanwhile, or
``max_wait_seconds``), the short domain's free slots go to the others (fallback), each such
slot counted.

Pure Python, no verl import; deterministic for a given ``seed`` (the seed only orders ties).
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from verl.base_config import BaseConfig

from verl_mopd.errors import ConfigError


@dataclass(kw_only=True)
class QuotaConfig(BaseConfig):
    """The ``quota`` block (``trainer.v1.sampler.sampler_kwargs.quota``).

    Args:
        shares: target share of accepted groups per domain (values of the ``platform`` field);
            positive, summing to 1. Paper (§3.4.3): ``{mobile: 0.5, desktop: 0.5}``.
        max_wait_groups: fallback after this many groups finished while a full domain waits
            on a short one (the fast bound). None disables this bound.
        max_wait_seconds: fallback after this many seconds of such waiting (the backstop).
            Required and finite: when the short domain's rollouts hang and the full domain is
            paused, no group finishes, so only a time bound can end the wait. Once the fallback
            fires nothing is paused, so the other domains fill the free slots.
        backpressure_ahead_batches: a domain is paused once its accepted + buffered groups
            cover its quota for this many batches beyond the current one (0: the current batch
            only, right for sync; 1 keeps one batch of look-ahead for async trainers).
        seed: orders ties between domains (quota rounding, fallback order).
    """

    shares: dict[str, float] = field(default_factory=dict)
    max_wait_groups: int | None = 64
    max_wait_seconds: float = 600.0
    backpressure_ahead_batches: int = 0
    seed: int = 0

    def __post_init__(self):
        errors = []
        shares = dict(self.shares or {})
        if not shares:
            errors.append("quota.shares is empty; give a share per domain, e.g. {mobile: 0.5, desktop: 0.5}")
        for domain, share in shares.items():
            if not isinstance(domain, str) or not domain:
                errors.append(f"quota.shares has key {domain!r}; keys must be non-empty domain names")
            if not isinstance(share, int | float) or isinstance(share, bool) or not share > 0:
                errors.append(f"quota.shares[{domain!r}]={share!r}; must be a number > 0")
        if shares and not errors and abs(sum(shares.values()) - 1.0) > 1e-6:
            errors.append(f"quota.shares={shares} sums to {sum(shares.values())}; must sum to 1")
        if self.max_wait_groups is not None and (
            not isinstance(self.max_wait_groups, int) or self.max_wait_groups < 0
        ):
            errors.append(f"quota.max_wait_groups={self.max_wait_groups!r}; must be an int >= 0 or null")
        wait_s = self.max_wait_seconds
        if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) or not 0 <= wait_s < math.inf:
            errors.append(
                f"quota.max_wait_seconds={wait_s!r}; must be a finite number of seconds >= 0 (default 600): "
                "a domain whose rollouts hang finishes no group, so only this bound ends the wait"
            )
        if not isinstance(self.backpressure_ahead_batches, int) or self.backpressure_ahead_batches < 0:
            errors.append(
                f"quota.backpressure_ahead_batches={self.backpressure_ahead_batches!r}; must be an int >= 0"
            )
        if errors:
            raise ConfigError(errors, "quota config")
        object.__setattr__(self, "shares", {str(k): float(v) for k, v in shares.items()})


@dataclass
class Decision:
    """Result of ``QuotaScheduler.poll``.

    batch: the group ids of the completed batch (exactly ``batch_size``), or None.
    paused: domains whose producers should pause (backpressure).
    fallback: whether the bounded wait ran out for this batch.
    """

    batch: list[Hashable] | None
    paused: frozenset[str]
    fallback: bool


class QuotaScheduler:
    """Accepts valid groups per domain against target shares.

    Protocol, per batch: ``start_batch(batch_size, now)``; ``add(gid, domain)`` once for every
    valid group that becomes available (it waits in a per-domain FIFO); ``note_finished(domain)``
    for every group that finished but was dropped; ``poll(now)`` until it returns a batch;
    ``remove(gid)`` for a buffered group that went away (stale eviction). Groups not used stay
    buffered for the next batch; ``drain()`` empties the buffer (sync trainers discard it).

    Quotas: ``floor(share * batch_size)`` plus one extra slot for the domains with the largest
    cumulative deficit (target minus granted so far), so each batch is within one group of the
    target and the long-run mix converges to it exactly.
    """

    def __init__(self, config: QuotaConfig):
        self.config = config
        self.domains = sorted(config.shares)
        rng = random.Random(config.seed)
        self._tie_order = {d: i for i, d in enumerate(rng.sample(self.domains, len(self.domains)))}
        self._pending: dict[str, deque] = {d: deque() for d in self.domains}
        self._domain_of: dict[Hashable, str] = {}
        # Cumulative state (checkpointed).
        self.granted_total = {d: 0 for d in self.domains}
        self.accepted_total = {d: 0 for d in self.domains}
        self.fallback_slots_total = 0
        self.fallback_batches_total = 0
        self.batches_total = 0
        self._batch_size = 0
        self.last_batch: dict | None = None
        self._reset_batch()

    # ---------------------------------------------------------------- quotas
    def quotas_for(self, batch_size: int) -> dict[str, int]:
        """Integer quotas for the next batch (pure: does not change state)."""
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size={batch_size!r}; must be a positive int")
        shares = self.config.shares
        quotas = {d: math.floor(shares[d] * batch_size + 1e-9) for d in self.domains}
        extra = batch_size - sum(quotas.values())
        target_after = {d: shares[d] * (self.batches_slots_total + batch_size) for d in self.domains}
        deficit = {d: target_after[d] - self.granted_total[d] - quotas[d] for d in self.domains}
        for d in sorted(self.domains, key=lambda d: (-deficit[d], self._tie_order[d]))[:extra]:
            quotas[d] += 1
        return quotas

    @property
    def batches_slots_total(self) -> int:
        return sum(self.granted_total.values())

    # ----------------------------------------------------------------- batch
    def _reset_batch(self) -> None:
        self.quotas: dict[str, int] = {d: 0 for d in self.domains}
        self.accepted: dict[str, list] = {d: [] for d in self.domains}
        self.fallback_accepted: list = []
        self._open = False
        self._wait_started_at: float | None = None
        self._waited_groups = 0
        self._fallback = False
        self._batch: list | None = None

    def start_batch(self, batch_size: int, now: float) -> dict[str, int]:
        """Open a batch of ``batch_size`` groups; returns its quotas."""
        if self._open:
            raise RuntimeError("start_batch called while a batch is open; finish it with poll() first")
        quotas = self.quotas_for(batch_size)
        self._reset_batch()
        self.quotas = quotas
        self._batch_size = batch_size
        self._open = True
        self._now = now
        return dict(quotas)

    def _check_domain(self, domain: str) -> None:
        if domain not in self._pending:
            raise ValueError(f"domain {domain!r} has no quota; configured domains: {self.domains}")

    def _short(self) -> list[str]:
        return [d for d in self.domains if len(self.accepted[d]) < self.quotas[d]]

    def _waiting(self) -> bool:
        """Some domain can fill its quota (accepted + buffered) while another cannot: the batch
        waits on the short one."""
        if not self._open or self._batch is not None:
            return False
        supply = {d: len(self.accepted[d]) + len(self._pending[d]) for d in self.domains}
        short = [d for d in self.domains if supply[d] < self.quotas[d]]
        return bool(short) and len(short) < len(self.domains)

    def add(self, gid: Hashable, domain: str) -> None:
        """A valid group of ``domain`` is available."""
        self._check_domain(domain)
        if gid in self._domain_of:
            raise ValueError(f"group {gid!r} was added twice")
        self.note_finished(domain)
        self._domain_of[gid] = domain
        self._pending[domain].append(gid)

    def note_finished(self, domain: str) -> None:
        """A group of ``domain`` finished (kept or dropped): one unit of waiting, if waiting."""
        self._check_domain(domain)
        if self._waiting():
            self._waited_groups += 1

    def remove(self, gid: Hashable) -> bool:
        """Forget a group that went away (buffered, or accepted into the open batch, whose slot
        opens again); returns whether the scheduler held it."""
        domain = self._domain_of.get(gid)
        if domain is None:
            return False
        for holder in (self._pending[domain], self.accepted[domain], self.fallback_accepted):
            if gid in holder:
                holder.remove(gid)
                del self._domain_of[gid]
                return True
        return False

    def drain(self) -> list:
        """Remove and return every buffered group (sync trainers discard the surplus)."""
        out = []
        for d in self.domains:
            out.extend(self._pending[d])
            for gid in self._pending[d]:
                del self._domain_of[gid]
            self._pending[d].clear()
        return out

    def can_fill(self, domain: str) -> bool:
        """Whether ``domain``'s accepted + buffered groups already cover its quota."""
        self._check_domain(domain)
        return len(self.accepted[domain]) + len(self._pending[domain]) >= self.quotas[domain]

    def buffered(self) -> dict[str, int]:
        return {d: len(self._pending[d]) for d in self.domains}

    def paused_domains(self) -> frozenset[str]:
        """Domains whose producers should pause: accepted + buffered covers their quota for the
        current batch and ``backpressure_ahead_batches`` more. None once the fallback has fired:
        the short domains' free slots are open to every domain."""
        if self._fallback:
            return frozenset()
        ahead = self.config.backpressure_ahead_batches
        return frozenset(
            d
            for d in self.domains
            if self.quotas[d] + ahead * self.config.shares[d] * self._batch_size > 0
            and len(self.accepted[d]) + len(self._pending[d])
            >= self.quotas[d] + ahead * self.config.shares[d] * self._batch_size
        )

    def progress(self) -> dict[str, tuple[int, int]]:
        """Per domain (accepted in the open batch, its quota)."""
        return {d: (len(self.accepted[d]), self.quotas[d]) for d in self.domains}

    def poll(self, now: float) -> Decision:
        """Accept buffered groups against the quotas; fall back once the wait bound is hit."""
        if self._batch is not None:
            return Decision(list(self._batch), frozenset(), self._fallback)
        if not self._open:
            raise RuntimeError("poll called with no open batch; call start_batch first")
        # Never past batch_size: slots the fallback already gave away stay given when the short
        # domain delivers late.
        free = self._batch_size - sum(len(v) for v in self.accepted.values()) - len(self.fallback_accepted)
        for d in self.domains:
            while free > 0 and len(self.accepted[d]) < self.quotas[d] and self._pending[d]:
                self.accepted[d].append(self._pending[d].popleft())
                free -= 1
        if self._waiting() and self._wait_started_at is None:
            self._wait_started_at = now
        if not self._fallback and self._short():
            cfg = self.config
            by_groups = cfg.max_wait_groups is not None and self._waited_groups >= cfg.max_wait_groups
            by_time = (
                cfg.max_wait_seconds is not None
                and self._wait_started_at is not None
                and now - self._wait_started_at >= cfg.max_wait_seconds
            )
            if by_groups or by_time:
                self._fallback = True
        if self._fallback:
            self._fill_by_fallback()
        filled = sum(len(v) for v in self.accepted.values()) + len(self.fallback_accepted)
        if filled < self._batch_size:
            return Decision(None, self.paused_domains(), self._fallback)
        return self._close()

    def _fill_by_fallback(self) -> None:
        free = sum(self.quotas[d] - len(self.accepted[d]) for d in self._short()) - len(self.fallback_accepted)
        counts = {d: len(self.accepted[d]) for d in self.domains}
        for gid in self.fallback_accepted:
            counts[self._domain_of[gid]] += 1
        while free > 0:
            donors = [d for d in self.domains if self._pending[d]]
            if not donors:
                return
            # Give the slot to the donor furthest below its target share.
            d = min(donors, key=lambda d: (counts[d] / self.config.shares[d], self._tie_order[d]))
            self.fallback_accepted.append(self._pending[d].popleft())
            counts[d] += 1
            free -= 1

    def _close(self) -> Decision:
        batch = [gid for d in self.domains for gid in self.accepted[d]] + list(self.fallback_accepted)
        if len(batch) != self._batch_size:  # an invariant, checked also under python -O
            raise RuntimeError(f"QuotaScheduler closed a batch of {len(batch)} groups, batch_size={self._batch_size}")
        for d in self.domains:
            self.granted_total[d] += self.quotas[d]
            self.accepted_total[d] += len(self.accepted[d])
        for gid in self.fallback_accepted:
            self.accepted_total[self._domain_of[gid]] += 1
        self.fallback_slots_total += len(self.fallback_accepted)
        self.fallback_batches_total += int(self._fallback)
        self.batches_total += 1
        accepted = {d: len(self.accepted[d]) for d in self.domains}
        for gid in self.fallback_accepted:
            accepted[self._domain_of[gid]] += 1
        self.last_batch = {
            "accepted": accepted,
            "quotas": dict(self.quotas),
            "fallback_slots": len(self.fallback_accepted),
            "fallback": self._fallback,
        }
        for gid in batch:
            del self._domain_of[gid]
        self._batch = batch
        self._open = False
        return Decision(list(batch), frozenset(), self._fallback)

    # ------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        """Cumulative counters (buffered groups are rebuilt from the replay buffer on resume)."""
        return {
            "shares": dict(self.config.shares),
            "granted_total": dict(self.granted_total),
            "accepted_total": dict(self.accepted_total),
            "fallback_slots_total": self.fallback_slots_total,
            "fallback_batches_total": self.fallback_batches_total,
            "batches_total": self.batches_total,
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict`; ValueError naming the field for anything malformed, nothing
        changed then."""
        if not isinstance(state, Mapping):
            raise ValueError(f"scheduler state is a {type(state).__name__}; expected an object")
        missing = sorted(set(self.state_dict()) - set(state))
        if missing:
            raise ValueError(f"scheduler state lacks {missing}")
        shares = state["shares"]
        if not isinstance(shares, Mapping) or dict(shares) != dict(self.config.shares):
            raise ValueError(
                f"checkpointed quota.shares={shares!r} differ from configured "
                f"{dict(self.config.shares)}; resume with the same shares"
            )
        per_domain = {name: _counters(state[name], name, self.domains) for name in ("granted_total", "accepted_total")}
        totals = {name: _count(state[name], name) for name in ("fallback_slots_total", "fallback_batches_total", "batches_total")}
        granted, accepted = per_domain["granted_total"], per_domain["accepted_total"]
        if sum(accepted.values()) != sum(granted.values()):
            raise ValueError(f"accepted_total={accepted} and granted_total={granted} count different numbers of slots")
        if totals["fallback_slots_total"] > sum(granted.values()) or totals["fallback_batches_total"] > totals["batches_total"]:
            raise ValueError(f"fallback counters {totals} exceed the slots granted ({sum(granted.values())})")
        self.granted_total, self.accepted_total = granted, accepted
        self.fallback_slots_total = totals["fallback_slots_total"]
        self.fallback_batches_total = totals["fallback_batches_total"]
        self.batches_total = totals["batches_total"]


def _count(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r}; expected an int >= 0")
    return value


def _counters(value, name: str, domains: list[str]) -> dict[str, int]:
    if not isinstance(value, Mapping) or set(value) != set(domains):
        keys = sorted(value) if isinstance(value, Mapping) else type(value).__name__
        raise ValueError(f"{name} has {keys}; expected a count for each domain {domains}")
    return {d: _count(value[d], f"{name}[{d!r}]") for d in domains}

"""In-memory stand-in for the TransferQueue client calls verl's ReplayBuffer makes
(``kv_list``, ``kv_batch_get``, ``kv_batch_put``, ``kv_put``, ``kv_clear``), plus a simulated
rollout world that writes trajectories the way ``AgentLoopWorkerTQ`` does (keys
``{uid}_{session}_{index}``, prompt tags ``{is_prompt, status, global_steps}``)."""

from __future__ import annotations

import random
import uuid
from collections import defaultdict
from dataclasses import dataclass

import torch

from verl.utils.tensordict_utils import list_of_dict_to_tensordict


class MemoryTQ:
    def __init__(self, on_list=None):
        self.tags: dict[str, dict[str, dict]] = defaultdict(dict)
        self.fields: dict[str, dict[str, dict]] = defaultdict(dict)
        self.on_list = on_list  # called on every kv_list: one poll = one tick of the world

    def kv_list(self, partition_id: str | None = None):
        if self.on_list is not None:
            self.on_list()
        parts = [partition_id] if partition_id else list(self.tags)
        return {p: {k: dict(t) for k, t in self.tags[p].items()} for p in parts}

    def kv_put(self, key, partition_id, fields=None, tag=None):
        self.kv_batch_put([key], partition_id, fields=[fields] if fields else None, tags=[tag] if tag else None)

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        for i, key in enumerate(keys):
            if tags is not None:
                self.tags[partition_id].setdefault(key, {}).update(tags[i])
            if fields is not None:
                self.fields[partition_id].setdefault(key, {}).update(fields[i])
                self.tags[partition_id].setdefault(key, {})

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        # As verl 0.9.1's TransferQueue: a field that any one of the keys lacks is left out of the answer.
        stored = [self.fields[partition_id][key] for key in keys]
        wanted = select_fields or sorted({f for row in stored for f in row})
        common = [f for f in wanted if all(f in row for row in stored)]
        return list_of_dict_to_tensordict([{f: row[f] for f in common} for row in stored])

    def kv_clear(self, keys, partition_id):
        for key in keys if isinstance(keys, list) else [keys]:
            self.tags[partition_id].pop(key, None)
            self.fields[partition_id].pop(key, None)


@dataclass
class Domain:
    name: str
    ticks: int  # polls a group takes to finish
    mixed_rate: float  # probability that a group has mixed outcomes
    env_failure_rate: float = 0.0


class World:
    """Producers for several domains. ``submit(n)`` is the trainer's refill_fn; the prompt stream
    cycles through ``mix`` (a dataset with that domain mix), skipping paused domains when
    ``paused_fn`` is given (the domain-aware refill hook)."""

    def __init__(self, domains, mix, n=4, seed=0, paused_fn=None):
        self.domains = {d.name: d for d in domains}
        self.mix = list(mix)
        self.n = n
        self.rng = random.Random(seed)
        self.tq = MemoryTQ(on_list=self.tick)
        self.inflight: list[tuple[int, str, str]] = []  # (finish_tick, uid, domain)
        self.now = 0
        self.global_steps = 1
        self.cursor = 0
        self.paused_fn = paused_fn
        self.submitted = defaultdict(int)

    def _next_domain(self):
        paused = self.paused_fn() if self.paused_fn else frozenset()
        for _ in range(len(self.mix)):
            d = self.mix[self.cursor % len(self.mix)]
            self.cursor += 1
            if d not in paused:
                return d
        d = self.mix[self.cursor % len(self.mix)]
        self.cursor += 1
        return d

    def submit(self, num_prompts: int) -> int:
        for _ in range(num_prompts):
            d = self._next_domain()
            uid = uuid.UUID(int=self.rng.getrandbits(128)).hex
            self.tq.kv_put(uid, "train", tag={"is_prompt": True, "status": "pending", "global_steps": self.global_steps})
            self.inflight.append((self.now + self.domains[d].ticks, uid, d))
            self.submitted[d] += 1
        return num_prompts

    def tick(self):
        self.now += 1
        done = [x for x in self.inflight if x[0] <= self.now]
        self.inflight = [x for x in self.inflight if x[0] > self.now]
        for _, uid, d in done:
            spec = self.domains[d]
            mixed = self.rng.random() < spec.mixed_rate
            base = self.rng.choice([1.0, -0.5, -1.0])
            scores = [base] * self.n
            if mixed:
                scores[self.rng.randrange(self.n)] = 1.0 if base != 1.0 else -1.0
            failed = [self.rng.random() < spec.env_failure_rate for _ in range(self.n)]
            self.write_group(uid, d, scores, failed)

    def write_group(self, uid, domain, scores, failed, status="finished"):
        keys, fields, tags = [], [], []
        for s, (score, fail) in enumerate(zip(scores, failed, strict=True)):
            rm = torch.zeros(3)
            rm[-1] = score
            keys.append(f"{uid}_{s}_0")
            fields.append(
                {
                    "rm_scores": rm,
                    "platform": domain,
                    "extra_fields": {"reward_extra_info": {"acc": float(score == 1.0), "env_failure": fail}},
                    "extra_info": {"index": s},
                    "uid": uid,
                }
            )
            tags.append({"status": "success", "seq_len": 8, "global_steps": self.global_steps})
        self.tq.kv_batch_put(keys, "train", fields=fields, tags=tags)
        prompt_tag = self.tq.tags["train"].get(uid) or {"is_prompt": True, "global_steps": self.global_steps}
        self.tq.kv_put(uid, "train", tag={**prompt_tag, "status": status})

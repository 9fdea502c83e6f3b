"""The demo's one progress line: stages done over all seeds, elapsed time, and an ETA from what was measured.

A run is a fixed plan of stages: the two bases, then per seed ``teachers``, ``mopd``, ``evals`` and,
with baselines, ``grpo`` and ``baselines`` (the names of ``run_seed``'s ``stage_s``). Each stage has
a prior cost (:func:`stage_plan`: rows it trains or generates, from the knobs). When a stage
finishes, its worker reports how long it took; the ETA then uses, per stage name, the mean measured
seconds where that stage already ran, the measured seconds per prior unit elsewhere, and divides the
remaining work by the concurrency seen so far (work seconds done / wall seconds elapsed). No torch here.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TextIO

from verl_mopd.demo.config import PLATFORMS, DemoConfig

__all__ = ["Progress", "ProgressLine", "stage_plan"]

#: prior cost of one RL rollout row relative to one SFT row (sampling up to max_new_tokens tokens,
#: the teacher scoring and the backward passes); corrected by measurement as soon as a stage ends
RL_ROW_COST = 4.0
#: prior cost of one greedy evaluation row relative to one SFT row
EVAL_ROW_COST = 1.0


def stage_plan(cfg: DemoConfig, seeds: list[int], bases: tuple[str, ...] = ("teacher", "student")) -> dict[tuple, float]:
    """``{(seed or "base", stage): prior cost}`` of every stage the run will do, in SFT-row units.

    ``bases``: the roles to pretrain (those already cached cost nothing and are left out).
    """
    rl = cfg.steps * cfg.prompts_per_step * cfg.rollout_n * RL_ROW_COST
    ev = len(PLATFORMS) * cfg.eval_tasks * EVAL_ROW_COST
    plan: dict[tuple, float] = {}
    for role in bases:
        steps = cfg.teacher_base_steps if role == "teacher" else cfg.base_steps
        plan["base", role] = float(steps * cfg.sft_batch)
    for seed in seeds:
        plan[seed, "teachers"] = float(len(PLATFORMS) * cfg.teacher_steps * cfg.sft_batch)
        plan[seed, "mopd"] = rl
        plan[seed, "evals"] = 5 * ev  # the two teachers, the teacher base, MOPD, the student base
        if cfg.baselines:
            plan[seed, "grpo"] = rl + ev
            # mixed SFT, the two single-platform SFTs, their two merges: 5 evals
            plan[seed, "baselines"] = (cfg.mixed_steps + len(PLATFORMS) * cfg.teacher_steps) * cfg.sft_batch + 5 * ev
    return plan


@dataclass
class Progress:
    """What is done of a :func:`stage_plan` and what is left, in seconds. Pure: the caller passes the clock.

    ``done(key, seconds, now)`` records a finished stage (its own duration, measured in its worker);
    ``eta(now)`` is ``None`` until a stage has finished.
    """

    plan: dict[tuple, float]
    start: float
    measured: dict[tuple, float] = field(default_factory=dict)
    _now: float = 0.0

    def done(self, key: tuple, seconds: float, now: float) -> None:
        if key not in self.plan:
            raise KeyError(f"stage {key} is not in the plan ({len(self.plan)} stages)")
        self.measured[key] = max(0.0, float(seconds))
        self._now = now

    @property
    def fraction(self) -> float:
        total = sum(self.plan.values())
        return sum(self.plan[k] for k in self.measured) / total if total else 1.0

    def remaining_work(self) -> float | None:
        """Seconds of single-worker work left (``None`` until a stage that took time has finished)."""
        if not self.measured:
            return None
        by_stage: dict[str, list[float]] = {}
        for (_, stage), s in self.measured.items():
            by_stage.setdefault(stage, []).append(s)
        # seconds per prior unit from the seeds' stages (a reused base took no time), else from the bases
        seeds = [k for k in self.measured if k[0] != "base"] or list(self.measured)
        prior, seconds = sum(self.plan[k] for k in seeds), sum(self.measured[k] for k in seeds)
        if not prior or not seconds:
            return None
        per_unit = seconds / prior
        left = 0.0
        for key, cost in self.plan.items():
            if key in self.measured:
                continue
            same = by_stage.get(key[1])
            left += sum(same) / len(same) if same and key[0] != "base" else cost * per_unit
        return left

    def eta(self, now: float) -> float | None:
        """Wall seconds left: the remaining work over the concurrency measured so far."""
        left = self.remaining_work()
        elapsed = now - self.start
        if left is None or elapsed <= 0:
            return None
        concurrency = max(1.0, sum(self.measured.values()) / elapsed)
        return left / concurrency

    def line(self, now: float, current: str = "") -> str:
        """``[stage 5/17] 31% · 1m02s elapsed · ETA 2m15s · seed 1 mopd``."""
        n, total = len(self.measured), len(self.plan)
        eta = self.eta(now)
        parts = [f"[stage {n}/{total}] {self.fraction:4.0%}", f"{_clock(now - self.start)} elapsed",
                 "ETA " + ("--" if eta is None else _clock(eta)) if n < total else "done"]
        return " · ".join(parts + ([current] if current else []))


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class ProgressLine:
    """Prints log lines whole and keeps one progress line under them.

    On a terminal the progress line is redrawn in place (``\\r``) below the log; elsewhere (a file,
    a pipe, CI) it is printed as a plain line whenever a stage finishes, so logs stay readable.
    """

    def __init__(self, progress: Progress, stream: TextIO | None = None, tty: bool | None = None):
        self.progress, self.stream = progress, stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self._shown = ""

    def log(self, text: str) -> None:
        self._clear()
        print(text, file=self.stream, flush=True)
        if self.tty and self._shown:
            print(self._shown, end="", file=self.stream, flush=True)  # the line again, below

    def stage_done(self, key: tuple, seconds: float, now: float) -> None:
        self.progress.done(key, seconds, now)
        who = "bases" if key[0] == "base" else f"seed {key[0]}"
        text = self.progress.line(now, f"{who}: {key[1]} done")
        if not self.tty:
            print(text, file=self.stream, flush=True)
            return
        self._clear()
        self._shown = text
        print(text, end="", file=self.stream, flush=True)

    def close(self) -> None:
        if self.tty and self._shown:
            print(file=self.stream, flush=True)
            self._shown = ""

    def _clear(self) -> None:
        if self.tty and self._shown:
            print("\r" + " " * len(self._shown) + "\r", end="", file=self.stream)

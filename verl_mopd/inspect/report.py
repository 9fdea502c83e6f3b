"""What ``verl-mopd inspect`` shows, computed from :class:`~verl_mopd.inspect.dumps.Sample` records
(pure: no files, no HTML).

Per token of a gated-on sample: ``K3 = exp(d) - d - 1``, ``d = teacher - student`` log-prob, by
:func:`verl_mopd.losses.k3_kl` (the loss's own function, with its tangent above ``d = 3`` and its
clamp below ``d = -20``), in float64 and without rollout importance weights: the divergence
itself, not its weight in the loss. A token counts where the response mask is 1 and, with
``kl_skip_thought``, at or after ``kl_start``, as in the loss. Gated-off samples (``gate == 0``)
get no K3: their stored teacher log-probs are the student's own (a stand-in the loss multiplies
by 0, ``verl_mopd.teachers.group``).

Per platform and step: the samples, the gate's on-fraction, the token-mean K3 over the counted
tokens of gated-on samples, and the mean task score. Per platform: the tokens with the largest
K3, the samples with the largest mean K3, and the (student, teacher) log-prob pairs of the counted
tokens, subsampled evenly to at most ``max_points``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from verl_mopd.inspect.dumps import Sample

__all__ = ["PlatformReport", "StepRow", "TokenK3", "build_report", "sample_k3"]


@dataclass
class StepRow:
    step: int
    samples: int
    gate_on: float | None      # fraction of samples with the KL on (None: no gate dumped)
    k3_mean: float | None      # token-mean K3 over counted tokens of gated-on samples (None: none)
    tokens: int                # those counted tokens
    score_mean: float | None


@dataclass
class TokenK3:
    k3: float
    teacher: float
    student: float
    token: str
    context: str               # the tokens before it in its response (up to 4)
    step: int
    uid: str
    key: str                   # the sample's own key
    position: int              # in the response


@dataclass
class ShownSample:
    sample: Sample
    tokens: list[str] | None   # decoded tokens (step dumps); None: text only
    k3: np.ndarray | None      # per response token; NaN where the token does not count
    k3_mean: float | None


@dataclass
class PlatformReport:
    platform: str
    steps: list[StepRow]
    top_tokens: list[TokenK3]
    samples: list[ShownSample]
    scatter: np.ndarray        # (n, 3): student, teacher, K3 of the shown points
    scatter_total: int         # counted tokens in all (the scatter shows at most max_points)
    n_samples: int
    gated_off: int
    k3_mean: float | None      # over every counted token of the platform
    tokens: int
    k3_all: np.ndarray         # every counted token's K3 (for the shading scale)


def counted_mask(sample: Sample) -> np.ndarray:
    """The response tokens whose K3 counts (mask 1, at or after ``kl_start``), for a gated-on sample."""
    mask = sample.response_mask != 0
    if sample.kl_start is not None:
        mask &= np.arange(len(mask)) >= sample.kl_start
    return mask


def has_kl(sample: Sample) -> bool:
    """Whether ``sample`` has a teacher's log-probs that the loss uses (dumped, and not gated off)."""
    return sample.teacher is not None and sample.student is not None and (sample.gate is None or sample.gate != 0)


def sample_k3(sample: Sample) -> np.ndarray:
    """Per-token K3 of ``sample`` (:func:`verl_mopd.losses.k3_kl`, float64); NaN where it does not count."""
    import torch

    from verl_mopd.losses import k3_kl

    k3 = k3_kl(torch.from_numpy(sample.student)[None], torch.from_numpy(sample.teacher)[None])[0].numpy()
    return np.where(counted_mask(sample), k3, np.nan)


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def _platform(platform: str, samples: list[Sample], decode: Callable[[int], str] | None, top: int, n_shown: int,
              max_points: int) -> PlatformReport:
    by_step: dict[int, list[Sample]] = {}
    for s in samples:
        by_step.setdefault(s.step, []).append(s)
    k3s = {id(s): sample_k3(s) for s in samples if has_kl(s)}
    steps = []
    for step in sorted(by_step):
        group = by_step[step]
        values = np.concatenate([k3s[id(s)][~np.isnan(k3s[id(s)])] for s in group if id(s) in k3s] or [np.zeros(0)])
        gates = [s.gate for s in group if s.gate is not None]
        steps.append(StepRow(step=step, samples=len(group),
                             gate_on=float(np.mean([g != 0 for g in gates])) if gates else None,
                             k3_mean=float(values.sum() / len(values)) if len(values) else None, tokens=len(values),
                             score_mean=_mean([s.score for s in group if s.score is not None])))

    def tok(sample: Sample, i: int) -> str:
        t = sample.token_ids[i]
        return decode(t) if decode is not None else f"⟨{t}⟩"

    # every counted token, largest K3 first (stable: ties keep the dump's order)
    kl = [s for s in samples if id(s) in k3s]
    where = [np.flatnonzero(~np.isnan(k3s[id(s)])) for s in kl]
    owner = np.concatenate([np.full(len(w), n) for n, w in enumerate(where)] or [np.zeros(0, int)]).astype(int)
    position = np.concatenate(where or [np.zeros(0, int)]).astype(int)
    value = np.concatenate([k3s[id(s)][w] for s, w in zip(kl, where)] or [np.zeros(0)])
    student = np.concatenate([s.student[w] for s, w in zip(kl, where)] or [np.zeros(0)])
    teacher = np.concatenate([s.teacher[w] for s, w in zip(kl, where)] or [np.zeros(0)])
    order = np.argsort(-value, kind="stable")
    top_tokens = []
    for k in order[:top]:
        s, i = kl[owner[k]], int(position[k])
        top_tokens.append(TokenK3(k3=float(value[k]), teacher=float(teacher[k]), student=float(student[k]),
                                  token=tok(s, i), context="".join(tok(s, j) for j in range(max(0, i - 4), i)),
                                  step=s.step, uid=s.uid, key=s.key, position=i))
    points = np.stack([student[order], teacher[order], value[order]], axis=1)
    if len(points) > max_points:  # evenly over the K3 order: the largest are always shown
        points = points[np.unique(np.linspace(0, len(points) - 1, max_points).round().astype(int))]

    means = {id(s): float(np.nanmean(k3s[id(s)])) for s in samples if id(s) in k3s and (~np.isnan(k3s[id(s)])).any()}
    if means:  # the samples the teachers disagree with most
        ranked = sorted((s for s in samples if id(s) in means), key=lambda s: -means[id(s)])
    else:  # no K3 (verl's rollout dumps): the last step's samples, best score first
        last = max(by_step)
        ranked = sorted(by_step[last], key=lambda s: -(s.score if s.score is not None else -np.inf))
    shown = [ShownSample(s, [tok(s, i) for i in range(len(s.token_ids))] if s.token_ids is not None else None,
                         k3s.get(id(s)), means.get(id(s))) for s in ranked[:n_shown]]
    all_k3 = value
    return PlatformReport(platform=platform, steps=steps, top_tokens=top_tokens, samples=shown, scatter=points,
                          scatter_total=len(value), n_samples=len(samples),
                          gated_off=sum(1 for s in samples if s.gate is not None and s.gate == 0),
                          k3_mean=float(all_k3.sum() / len(all_k3)) if len(all_k3) else None, tokens=len(all_k3),
                          k3_all=all_k3)


@dataclass
class Report:
    platforms: list[PlatformReport]
    shade_scale: float          # the K3 that gets full shading (99th percentile of every counted token's)
    has_k3: bool
    notes: list[str] = field(default_factory=list)


def build_report(samples: list[Sample], decode: Callable[[int], str] | None = None, *, top: int = 20,
                 samples_shown: int = 4, max_points: int = 3000) -> Report:
    """The report of ``samples``, one :class:`PlatformReport` per platform (sorted by name).

    ``decode(token_id) -> text`` turns step dumps' token ids into text (None: ``⟨id⟩``)."""
    for name, value, low in (("top", top, 1), ("samples_shown", samples_shown, 0), ("max_points", max_points, 2)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name}={value!r}: must be an integer >= {low}")
    if not samples:
        raise ValueError("no samples to report (every row was a padding row?)")
    platforms = sorted({s.platform for s in samples})
    reports = [_platform(p, [s for s in samples if s.platform == p], decode, top, samples_shown, max_points)
               for p in platforms]
    counted = np.concatenate([r.k3_all for r in reports])
    scale = max(float(np.quantile(counted, 0.99)) if len(counted) else 0.0, 1e-6)
    return Report(platforms=reports, shade_scale=scale, has_k3=any(r.tokens for r in reports))

"""The report as one static HTML page: inline CSS and SVG, no script, no external resource.

:func:`render` is a pure function of a :class:`~verl_mopd.inspect.report.Report`. Every number a
table or a token shows is also in a ``data-*`` attribute at full precision (``repr`` of the float),
so a test can read the rendered DOM back and compare it with the dump.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import numpy as np

from verl_mopd.inspect.report import PlatformReport, Report

__all__ = ["MARKER", "render"]

#: the page's first line: ``verl-mopd inspect`` overwrites only a file that starts with it
MARKER = "<!-- verl-mopd inspect report -->"
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
SHADE = (214, 39, 40)

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1180px;color:#222;
padding:0 16px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:2px solid #ddd}
h3{font-size:15px;margin:18px 0 6px}
.meta{color:#555} .note{background:#fff6e0;border:1px solid #e8c872;padding:6px 10px;margin:8px 0}
table{border-collapse:collapse;margin:6px 0;font-variant-numeric:tabular-nums}
th,td{border:1px solid #ddd;padding:2px 8px;text-align:right} th{background:#f4f4f4}
td.l,th.l{text-align:left} .charts{display:flex;flex-wrap:wrap;gap:16px}
.row{display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start}
.resp{font:13px/1.9 ui-monospace,Menlo,Consolas,monospace;white-space:pre-wrap;word-break:break-word;
border:1px solid #ddd;padding:6px 8px;background:#fff;margin:4px 0 12px}
.t{border-radius:2px} .t.off{color:#999} code{background:#f4f4f4;padding:0 3px}
.legend{display:inline-block;width:160px;height:12px;vertical-align:middle;border:1px solid #ccc;
background:linear-gradient(to right,rgba(214,39,40,0),rgba(214,39,40,1))}
svg text{font:11px system-ui,sans-serif;fill:#333}
"""


def _f(x: float | None, digits: int = 4) -> str:
    """A number as the page shows it (``-`` for none)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{digits}f}"


def _attr(x: float | int | str | None) -> str:
    return "" if x is None else html.escape(repr(x) if isinstance(x, float) else str(x), quote=True)


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]


def _line_chart(title: str, series: dict[str, list[tuple[float, float]]], colors: dict[str, str],
                y_range: tuple[float, float] | None = None, chart_id: str = "") -> str:
    """An SVG line chart of ``series`` ``{name: [(step, value), ...]}`` (points with a None value are left out)."""
    w, h, left, right, top, bottom = 360, 210, 52, 12, 24, 34
    pts = [(x, y) for s in series.values() for x, y in s if y is not None]
    if not pts:
        return (f'<svg id="{chart_id}" width="{w}" height="{h}" role="img"><text x="{w / 2}" y="{h / 2}" '
                f'text-anchor="middle">{html.escape(title)}: not in these dumps</text></svg>')
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = y_range if y_range else (min(ys), max(ys))
    if y1 - y0 < 1e-12:
        y0, y1 = y0 - 0.5, y1 + 0.5
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1

    def sx(x):
        return left + (x - x0) / (x1 - x0) * (w - left - right)

    def sy(y):
        return h - bottom - (y - y0) / (y1 - y0) * (h - top - bottom)

    out = [f'<svg id="{chart_id}" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img">',
           f'<text x="{left}" y="14" font-weight="bold">{html.escape(title)}</text>',
           f'<rect x="{left}" y="{top}" width="{w - left - right}" height="{h - top - bottom}" '
           'fill="none" stroke="#ccc"/>']
    for t in _ticks(y0, y1):
        out.append(f'<line x1="{left - 4}" x2="{left}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#999"/>'
                   f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">{t:.3g}</text>')
    steps = sorted({x for x in xs})
    for t in steps if len(steps) <= 8 else _ticks(x0, x1):
        out.append(f'<text x="{sx(t):.1f}" y="{h - bottom + 14}" text-anchor="middle">{t:.4g}</text>')
    out.append(f'<text x="{(left + w - right) / 2}" y="{h - 4}" text-anchor="middle">step</text>')
    for name, s in series.items():
        s = [(x, y) for x, y in s if y is not None]
        if not s:
            continue
        c = colors[name]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
        out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{c}"/>' for x, y in s]
    for i, name in enumerate(series):
        out.append(f'<rect x="{w - right - 90}" y="{top + 6 + 14 * i}" width="10" height="10" fill="{colors[name]}"/>'
                   f'<text x="{w - right - 76}" y="{top + 15 + 14 * i}">{html.escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def _scatter(r: PlatformReport, scale: float, color: str) -> str:
    """Teacher against student log-prob of the counted tokens, with the diagonal (teacher = student: K3 0)."""
    w = h = 330
    pad = 44
    pts = r.scatter
    if not len(pts):
        return '<p class="meta">No teacher log-probs for this platform in these dumps.</p>'
    finite = pts[:, :2][np.isfinite(pts[:, :2])]
    lo = min(float(finite.min()) if len(finite) else -1.0, -1e-3)
    lo = max(lo, -30.0)  # a teacher's -inf (or far below) is drawn on the edge
    lo = math.floor(lo * 1.05 * 10) / 10

    def s(v, flip):
        v = min(max(v, lo), 0.0) if np.isfinite(v) else lo
        f = (v - lo) / (0 - lo)
        return pad + f * (w - pad - 10) if not flip else h - pad - f * (h - pad - 10)

    out = [f'<svg class="scatter" data-platform="{_attr(r.platform)}" data-points="{len(pts)}" width="{w}" '
           f'height="{h}" viewBox="0 0 {w} {h}" role="img">',
           f'<rect x="{pad}" y="10" width="{w - pad - 10}" height="{h - pad - 10}" fill="none" stroke="#ccc"/>',
           f'<line x1="{s(lo, False):.1f}" y1="{s(lo, True):.1f}" x2="{s(0, False):.1f}" y2="{s(0, True):.1f}" '
           'stroke="#888" stroke-dasharray="4 3"/>']
    for t in _ticks(lo, 0.0):
        out.append(f'<text x="{s(t, False):.1f}" y="{h - pad + 14}" text-anchor="middle">{t:.3g}</text>'
                   f'<text x="{pad - 4}" y="{s(t, True) + 4:.1f}" text-anchor="end">{t:.3g}</text>')
    out.append(f'<text x="{(pad + w) / 2}" y="{h - 8}" text-anchor="middle">student log-prob</text>'
               f'<text x="12" y="{(h - pad) / 2}" text-anchor="middle" transform="rotate(-90 12 {(h - pad) / 2})">'
               'teacher log-prob</text>')
    for st, te, k in pts[::-1]:  # the largest K3 drawn last, on top
        a = 0.25 + 0.75 * min(1.0, k / scale)
        out.append(f'<circle cx="{s(st, False):.1f}" cy="{s(te, True):.1f}" r="2.2" fill="{color}" '
                   f'fill-opacity="{a:.2f}"/>')
    out.append("</svg>")
    return "".join(out)


def _shade(k3: float, scale: float) -> str:
    a = min(1.0, k3 / scale) if scale > 0 else 0.0
    return f"background:rgba({SHADE[0]},{SHADE[1]},{SHADE[2]},{a:.3f})"


def _tokens_html(shown, scale: float) -> str:
    s = shown.sample
    if shown.tokens is None:
        return f'<div class="resp">{html.escape(s.text or "")}</div>'
    spans = []
    for i, text in enumerate(shown.tokens):
        t = html.escape(text)
        k = None if shown.k3 is None else shown.k3[i]
        if k is None or math.isnan(k):
            why = ("not counted (mask or kl_start)" if shown.k3 is not None else
                   "gated off" if s.gate == 0 else "no teacher log-probs")
            spans.append(f'<span class="t off" data-pos="{i}" title="{why}">{t}</span>')
            continue
        tip = f"K3 {k:.4f} · teacher {s.teacher[i]:.4f} · student {s.student[i]:.4f}"
        spans.append(f'<span class="t" data-pos="{i}" data-k3="{_attr(float(k))}" '
                     f'data-teacher="{_attr(float(s.teacher[i]))}" data-student="{_attr(float(s.student[i]))}" '
                     f'style="{_shade(k, scale)}" title="{tip}">{t}</span>')
    return f'<div class="resp">{"".join(spans)}</div>'


def _steps_table(r: PlatformReport) -> str:
    rows = ["<table class=\"steps\"><tr><th>step</th><th>samples</th><th>KL on (gate)</th><th>K3 token-mean</th>"
            "<th>counted tokens</th><th>mean score</th></tr>"]
    for row in r.steps:
        rows.append(f'<tr data-step="{row.step}" data-samples="{row.samples}" data-gate-on="{_attr(row.gate_on)}" '
                    f'data-k3-mean="{_attr(row.k3_mean)}" data-tokens="{row.tokens}" '
                    f'data-score-mean="{_attr(row.score_mean)}"><td>{row.step}</td><td>{row.samples}</td>'
                    f"<td>{_f(row.gate_on, 3)}</td><td>{_f(row.k3_mean)}</td><td>{row.tokens}</td>"
                    f"<td>{_f(row.score_mean, 3)}</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def _top_table(r: PlatformReport, scale: float) -> str:
    if not r.top_tokens:
        return ""
    rows = ['<table class="top"><tr><th>#</th><th class="l">context</th><th class="l">token</th><th>K3</th>'
            "<th>teacher</th><th>student</th><th>step</th><th class=\"l\">uid</th><th>pos</th></tr>"]
    for n, t in enumerate(r.top_tokens, 1):
        rows.append(f'<tr data-k3="{_attr(t.k3)}" data-teacher="{_attr(t.teacher)}" data-student="{_attr(t.student)}" '
                    f'data-step="{t.step}" data-uid="{_attr(t.uid)}" data-pos="{t.position}"><td>{n}</td>'
                    f'<td class="l"><code>{html.escape(t.context)}</code></td>'
                    f'<td class="l"><code style="{_shade(t.k3, scale)}">{html.escape(t.token)}</code></td>'
                    f"<td>{_f(t.k3)}</td><td>{_f(t.teacher)}</td><td>{_f(t.student)}</td><td>{t.step}</td>"
                    f'<td class="l">{html.escape(t.uid)}</td><td>{t.position}</td></tr>')
    rows.append("</table>")
    return "".join(rows)


def _platform_section(r: PlatformReport, report: Report, color: str) -> str:
    pid = "".join(c if c.isalnum() else "-" for c in r.platform)
    head = (f'<section id="platform-{pid}" data-platform="{_attr(r.platform)}" data-samples="{r.n_samples}" '
            f'data-gated-off="{r.gated_off}" data-k3-mean="{_attr(r.k3_mean)}" data-tokens="{r.tokens}">'
            f'<h2 style="color:{color}">{html.escape(r.platform)}</h2>'
            f'<p class="meta">{r.n_samples} samples over {len(r.steps)} step(s), {r.gated_off} gated off; '
            f'K3 token-mean {_f(r.k3_mean)} over {r.tokens} counted tokens.</p>')
    parts = [head, "<h3>Per step</h3>", _steps_table(r)]
    if report.has_k3:
        parts += ['<div class="row"><div>', f"<h3>Tokens with the largest K3</h3>{_top_table(r, report.shade_scale)}",
                  "</div><div>",
                  f"<h3>Teacher against student log-prob ({len(r.scatter)} of {r.scatter_total} tokens)</h3>",
                  _scatter(r, report.shade_scale, color), "</div></div>"]
    title = ("Responses with the largest mean K3" if report.has_k3 and any(s.k3_mean is not None for s in r.samples)
             else "Responses of the last step")
    parts.append(f"<h3>{title}</h3>")
    for shown in r.samples:
        s = shown.sample
        gate = "-" if s.gate is None else ("on" if s.gate else "off")
        parts.append(f'<div class="sample" data-key="{_attr(s.key)}" data-uid="{_attr(s.uid)}" data-step="{s.step}" '
                     f'data-k3-mean="{_attr(shown.k3_mean)}"><p class="meta">step {s.step} · uid '
                     f"<code>{html.escape(s.uid)}</code> · score {_f(s.score, 3)} · gate {gate} · K3 mean "
                     f"{_f(shown.k3_mean)}</p>{_tokens_html(shown, report.shade_scale)}</div>")
    parts.append("</section>")
    return "".join(parts)


def render(report: Report, *, title: str, source: Sequence[str]) -> str:
    """The whole page. ``source``: lines saying what was read (shown under the title)."""
    colors = {r.platform: COLORS[i % len(COLORS)] for i, r in enumerate(report.platforms)}
    series = {k: {r.platform: [(row.step, getattr(row, k)) for row in r.steps] for r in report.platforms}
              for k in ("gate_on", "k3_mean", "score_mean")}
    notes = list(report.notes)
    if not report.has_k3:
        notes.append("These dumps hold no teacher log-probs, so no K3: verl's rollout dumps "
                     "(<code>trainer.rollout_data_dir</code>) carry text and score only. The step dumps of the "
                     "<code>mopd_*</code> trainers (<code>VERL_MOPD_STEP_DUMP=DIR</code>) carry both log-probs.")
    body = [MARKER, "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
            f"<h1>{html.escape(title)}</h1>",
            *[f'<p class="meta">{html.escape(line)}</p>' for line in source],
            *[f'<p class="note">{n}</p>' for n in notes]]
    if report.has_k3:
        body.append(f'<p class="meta">Shading: K3 = exp(d) - d - 1, d = teacher - student log-prob of the sampled '
                    f'token (verl_mopd.losses.k3_kl), from 0 <span class="legend"></span> '
                    f'<span id="shade-scale" data-scale="{_attr(report.shade_scale)}">{_f(report.shade_scale)}</span> '
                    "(the 99th percentile of every counted token) and above. Grey: tokens the K3 does not count "
                    "(response mask, kl_start) and gated-off samples. Hover a token for its numbers.</p>")
    body.append('<h2>Over steps</h2><div class="charts">')
    if any(row.gate_on is not None for r in report.platforms for row in r.steps):
        body.append(_line_chart("KL on (gate on-fraction)", series["gate_on"], colors, (0.0, 1.0), "chart-gate"))
    if report.has_k3:
        body.append(_line_chart("K3 token-mean (gated-on samples)", series["k3_mean"], colors, None, "chart-k3"))
    body.append(_line_chart("mean task score", series["score_mean"], colors, None, "chart-score"))
    body.append("</div>")
    body += [_platform_section(r, report, colors[r.platform]) for r in report.platforms]
    body.append('<p class="meta">Written by <code>verl-mopd inspect</code> (docs/inspect.md).</p></body></html>')
    return "\n".join(body) + "\n"

"""``verl-mopd inspect``: synthetic dumps in the trainer's format (``hooks.dump_step``) and in verl's
(``PPOTrainer._write_generations``, verl's own writer), the page opened in a real headless Chromium,
and every number the rendered DOM shows compared with a float64 reference computed here from the dumps.

Chromium is required: without it the browser tests FAIL with the install line, unless
``VERL_MOPD_SKIP_BROWSER_TESTS=1`` says to skip them. ``VERL_MOPD_INSPECT_SCREENSHOT=FILE`` saves the
page's screenshot there (docs/inspect.png is made so).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch

from verl_mopd import cli

PLATFORMS = ("desktop", "mobile")
STEPS = (1, 2, 3)
TEXTS = {
    "desktop": ['<think>the Save button is top left</think><tool_call>{"name": "computer_use", "arguments": '
                '{"action": "left_click", "coordinate": [120, 80]}}</tool_call>',
                '<think>scroll to the list</think><tool_call>{"name": "computer_use", "arguments": '
                '{"action": "scroll", "coordinate": [500, 500], "pixels": -3}}</tool_call>'],
    "mobile": ['<think>the Save button, portrait frame</think><tool_call>{"name": "mobile_use", "arguments": '
               '{"action": "click", "coordinate": [450, 620]}}</tool_call>',
               '<think>go back</think><tool_call>{"name": "mobile_use", "arguments": '
               '{"action": "system_button", "button": "Back"}}</tool_call>'],
}
BROWSER_OPT_OUT = "VERL_MOPD_SKIP_BROWSER_TESTS"
INSTALL = "apt-get install -y chromium (Debian/Ubuntu)"


# ---------------------------------------------------------------------------------- the dumps


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from verl_mopd.testing.tiny import build_tokenizer

    folder = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer([t for ts in TEXTS.values() for t in ts] * 10, vocab_size=300).save_pretrained(folder)
    return folder


def _rows(step: int, tok, rng: np.random.Generator) -> list[dict]:
    """One step's rows, as ``dump_step`` writes them: the response is the tail of ``input_ids``."""
    rows = []
    for platform in PLATFORMS:
        for group in range(2):
            uid = f"{platform}-{step}-{group}"
            gate = 0.0 if (platform, step, group) == ("mobile", 3, 0) else 1.0
            for k in range(2):
                text = TEXTS[platform][(group + k) % 2]
                prompt = tok.encode(f"<|im_start|>user task {step} {platform}<|im_end|>", add_special_tokens=False)
                response = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id, tok.pad_token_id]
                r = len(response)
                pieces = [tok.decode([t]) for t in response]
                student = rng.uniform(-2.5, -0.05, r)
                d = rng.normal(0.0, 0.3, r) * (1.0 - 0.25 * (step - 1))
                if platform == "mobile":  # the teacher disagrees on the portrait coordinates
                    d += np.array([-2.0 if p.strip().isdigit() else 0.0 for p in pieces]) / step
                if (platform, step, group, k) == ("desktop", 1, 0, 0):
                    student[3], d[3] = -4.0, 3.5  # above K3's linear threshold: the tangent
                teacher = np.minimum(student + d, -1e-3)  # a log-prob
                if (platform, step, group, k) == ("desktop", 2, 1, 1):
                    teacher[5] = -math.inf  # a token the teacher never emits
                if not gate:
                    teacher = student.copy()  # the group's stand-in for gated rows
                mask = torch.ones(r, dtype=torch.int64)
                mask[-1] = 0  # the pad
                think_end = pieces.index("</think>")
                rows.append({
                    "key": f"{uid}_{k}_0", "padding": False, "platform": platform, "uid": uid,
                    "input_ids": torch.tensor(prompt + response), "response_mask": mask,
                    "student": torch.tensor(student, dtype=torch.float32),
                    "teacher": torch.tensor(teacher, dtype=torch.float32), "gate": gate,
                    "kl_start": think_end + 1 if step == 3 else None,
                    "rollout_is_weights": torch.ones(r), "advantages": torch.full((r,), 0.5 - k),
                    "score": [1.0, -0.5, -1.0][(step + group + k + (platform == "mobile")) % 3],
                    "multi_modal_inputs": ({"pixel_values": torch.zeros(4, 6), "image_grid_thw": torch.tensor([[1, 2, 2]])}
                                           if k == 0 else None),
                })
    if step == 2:  # a padding row verl added to fill the batch: not a sample
        rows.append(dict(rows[0], key="pad_0_0", padding=True, platform="desktop", uid="pad"))
    return rows


@pytest.fixture(scope="module")
def step_dumps(tmp_path_factory, tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    folder = tmp_path_factory.mktemp("run") / "stage2" / "dumps"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for step in STEPS:
        torch.save({"step": step, "rows": _rows(step, tok, rng)}, folder / f"step_{step}.pt")
    (folder / "batching_state.jsonl").write_text("{}\n")  # what the trainer also writes there
    return folder


# ---------------------------------------------------------------- the float64 reference, written here


def _k3(teacher, student):
    """exp(d) - d - 1, d = teacher - student, tangent above d = 3 and constant below d = -20 (docs/loss.md)."""
    d = np.maximum(teacher.astype(np.float64) - student.astype(np.float64), -20.0)
    tangent = math.exp(3.0) - 4.0 + math.expm1(3.0) * (d - 3.0)
    return np.where(d > 3.0, tangent, np.exp(np.minimum(d, 3.0)) - d - 1.0)


def _reference(folder: Path) -> dict:
    """Per (platform, step): samples, gate on-fraction, K3 token-mean and counted tokens, mean score;
    per platform: every counted token's (K3, teacher, student, step, uid, position)."""
    steps, tokens = {}, {p: [] for p in PLATFORMS}
    for step in STEPS:
        rows = [r for r in torch.load(folder / f"step_{step}.pt", weights_only=False)["rows"] if not r["padding"]]
        for p in PLATFORMS:
            mine = [r for r in rows if r["platform"] == p]
            values = []
            for r in mine:
                if not r["gate"]:
                    continue
                t, s = r["teacher"].double().numpy(), r["student"].double().numpy()
                k = _k3(t, s)
                for i in range(len(k)):
                    if r["response_mask"][i] and (r["kl_start"] is None or i >= r["kl_start"]):
                        values.append(k[i])
                        tokens[p].append((k[i], t[i], s[i], step, r["uid"], i, r["key"]))
            steps[p, step] = {"samples": len(mine), "gate_on": sum(r["gate"] != 0 for r in mine) / len(mine),
                              "k3_mean": sum(values) / len(values), "tokens": len(values),
                              "score_mean": sum(r["score"] for r in mine) / len(mine)}
    return {"steps": steps, "tokens": tokens}


# --------------------------------------------------------------------------- the browser


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if found := shutil.which(name):
            return found
    if os.environ.get(BROWSER_OPT_OUT, "") not in ("", "0"):
        pytest.skip(f"no Chromium, and {BROWSER_OPT_OUT} is set")
    pytest.fail(f"the inspect page is tested in a real headless Chromium, and none is on PATH: {INSTALL}; "
                f"or set {BROWSER_OPT_OUT}=1 to skip these tests explicitly")


def _browser(page: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.glob('chromium-profile-*')))}"
    argv = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND", *args, page.resolve().as_uri()]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


class _DOM(HTMLParser):
    """The elements of the rendered DOM with their attributes and text (the text of nested elements included)."""

    def __init__(self):
        super().__init__()
        self.elements, self._open = [], []

    def handle_starttag(self, tag, attrs):
        element = {"tag": tag, "attrs": dict(attrs), "text": "", "section": None}
        for e in reversed(self._open):
            if e["tag"] == "section":
                element["section"] = e["attrs"].get("data-platform")
                break
        self.elements.append(element)
        if tag not in ("br", "img", "meta", "input", "link", "circle", "line", "rect", "polyline"):
            self._open.append(element)

    def handle_endtag(self, tag):
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i]["tag"] == tag:
                del self._open[i:]
                break

    def handle_data(self, data):
        for e in self._open:
            e["text"] += data


def _dom(text: str) -> list[dict]:
    parser = _DOM()
    parser.feed(text)
    return parser.elements


def _inspect(*argv) -> int:
    return cli.main(["inspect", *map(str, argv)])


# ------------------------------------------------------------------------------ the tests


def test_the_page_in_chromium_shows_the_dumps_numbers(step_dumps, tokenizer_dir, tmp_path, capsys):
    out = tmp_path / "report.html"
    run_dir = step_dumps.parent.parent  # the run's folder: the one dumps folder below it is found
    assert _inspect(run_dir, "--out", out, "--tokenizer", tokenizer_dir, "--top", 5, "--samples", 2) == 0
    printed = capsys.readouterr().out
    assert f"3 step dumps (VERL_MOPD_STEP_DUMP) in {step_dumps}: steps 1-3, 24 samples (1 padding rows left out)" \
        in printed and printed.rstrip().endswith(f"wrote {out}")
    html = out.read_text()
    assert html.startswith("<!-- verl-mopd inspect report -->")
    assert "http://" not in html and "https://" not in html and " src=" not in html and "<script" not in html

    dom = _dom(_browser(out, tmp_path, "--dump-dom").stdout)
    ref = _reference(step_dumps)
    sections = {e["attrs"]["data-platform"] for e in dom if e["tag"] == "section"}
    assert sections == set(PLATFORMS)

    # the per-step table of each platform: shown text and full-precision attributes
    rows = [e for e in dom if e["tag"] == "tr" and "data-gate-on" in e["attrs"]]
    assert sorted((e["section"], int(e["attrs"]["data-step"])) for e in rows) == sorted(ref["steps"])
    for e in rows:
        want, a = ref["steps"][e["section"], int(e["attrs"]["data-step"])], e["attrs"]
        assert int(a["data-samples"]) == want["samples"] and int(a["data-tokens"]) == want["tokens"]
        for key in ("gate_on", "k3_mean", "score_mean"):
            assert math.isclose(float(a[f"data-{key.replace('_', '-')}"]), want[key], rel_tol=1e-12, abs_tol=1e-12)
        at = next(i for i, x in enumerate(dom) if x is e)
        cells = [c["text"] for c in dom[at + 1:at + 7]]
        assert cells == [a["data-step"], str(want["samples"]), f"{want['gate_on']:.3f}", f"{want['k3_mean']:.4f}",
                         str(want["tokens"]), f"{want['score_mean']:.3f}"]
    gated = {(p, s): v["gate_on"] for (p, s), v in ref["steps"].items()}
    assert gated["mobile", 3] == 0.5 and all(v == 1.0 for k, v in gated.items() if k != ("mobile", 3))

    # the tokens with the largest K3: the reference's top 5, in order, with their numbers
    for p in PLATFORMS:
        top = [e for e in dom if e["tag"] == "tr" and e["section"] == p and "data-pos" in e["attrs"]]
        want = sorted(ref["tokens"][p], key=lambda t: -t[0])[:5]
        assert len(top) == 5
        for e, (k, t, s, step, uid, pos, _) in zip(top, want):
            a = e["attrs"]
            assert math.isclose(float(a["data-k3"]), k, rel_tol=1e-9, abs_tol=1e-12)
            assert (float(a["data-teacher"]), float(a["data-student"])) == (t, s)
            assert (int(a["data-step"]), a["data-uid"], int(a["data-pos"])) == (step, uid, pos)
            assert f"{k:.4f}" in e["text"]
    desktop = [e["attrs"] for e in dom if e["tag"] == "tr" and e["section"] == "desktop" and "data-pos" in e["attrs"]]
    tangent = math.exp(3) - 4 + math.expm1(3) * 0.5
    assert math.isclose(float(desktop[0]["data-k3"]), tangent, rel_tol=1e-6)  # d = 3.5 (float32 log-probs)
    assert float(desktop[1]["data-teacher"]) == -math.inf  # K3 at the clamp: 19 + e^-20
    assert math.isclose(float(desktop[1]["data-k3"]), 19 + math.exp(-20), rel_tol=1e-12)

    # every shaded token of the shown responses: its K3 is the reference's, its text the tokenizer's
    every = {(p, key, pos): k for p in PLATFORMS for k, _, _, _, _, pos, key in ref["tokens"][p]}
    spans = [e for e in dom if e["tag"] == "span" and "data-k3" in e["attrs"]]
    samples = [e for e in dom if e["tag"] == "div" and "data-key" in e["attrs"]]
    assert len(samples) == 4 and spans
    at = {id(x): i for i, x in enumerate(dom)}
    for e in spans:
        owner = next(s for s in reversed(samples) if at[id(s)] < at[id(e)])
        key = (e["section"], owner["attrs"]["data-key"], int(e["attrs"]["data-pos"]))
        assert math.isclose(float(e["attrs"]["data-k3"]), every[key], rel_tol=1e-9, abs_tol=1e-12)
    shown = "".join(e["text"] for e in dom if e["tag"] == "span" and e["section"] == "mobile"
                    and "t" in e["attrs"].get("class", "").split())
    assert '"coordinate": [450, 620]' in shown or "system_button" in shown  # decoded text, not <id>s
    assert float(next(e for e in dom if e["attrs"].get("id") == "shade-scale")["attrs"]["data-scale"]) == \
        pytest.approx(float(np.quantile([t[0] for p in PLATFORMS for t in ref["tokens"][p]], 0.99)), rel=1e-12)
    for p in PLATFORMS:
        scatter = next(e for e in dom if e["tag"] == "svg" and e["attrs"].get("data-platform") == p)
        assert int(scatter["attrs"]["data-points"]) == len(ref["tokens"][p])  # under --max-points: all of them


def test_the_page_renders_with_the_shading(step_dumps, tokenizer_dir, tmp_path):
    """A screenshot: the page is drawn (not blank) and the K3 shading's red is on it."""
    from PIL import Image

    out = tmp_path / "report.html"
    assert _inspect(step_dumps, "--out", out, "--tokenizer", tokenizer_dir, "--top", 8, "--samples", 1) == 0
    png = tmp_path / "page.png"
    _browser(out, tmp_path, "--hide-scrollbars", "--window-size=1200,2000", f"--screenshot={png}")
    image = np.asarray(Image.open(png).convert("RGB")).astype(int)
    assert image.shape[:2] == (2000, 1200)
    r, g, b = image[..., 0], image[..., 1], image[..., 2]
    strong_red = (r > 200) & (g < 110) & (b < 110)  # tokens at full shade (the legend's end included)
    assert strong_red.sum() > 200, strong_red.sum()
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 50  # text, charts, shading: not a blank page
    if target := os.environ.get("VERL_MOPD_INSPECT_SCREENSHOT"):
        Image.open(png).convert("RGB").quantize(128).save(target, optimize=True)


def test_verl_rollout_dumps_written_by_verls_own_writer(tmp_path, capsys):
    """``trainer.rollout_data_dir``: text and score per step; the platform from our ground truth; no K3."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    folder = tmp_path / "rollouts"
    want = {}
    for step in (1, 2):
        outputs, gts, scores = [], [], []
        for i, p in enumerate(["desktop", "mobile", "desktop", "mobile"]):
            outputs.append(TEXTS[p][i % 2])
            gts.append(json.dumps({"platform": p, "action": {"action": "click"}}))
            scores.append([1.0, -0.5, -1.0, 1.0][i] * step / 2)
            want.setdefault((p, step), []).append(scores[-1])
        PPOTrainer._write_generations([f"prompt {i}" for i in range(4)], outputs, gts, scores,
                                      {"uid": [f"u{step}_{i}_0" for i in range(4)]}, str(folder), step)
    out = tmp_path / "r.html"
    assert _inspect(folder, "--out", out) == 0
    assert "2 verl rollout dumps (trainer.rollout_data_dir)" in capsys.readouterr().out
    dom = _dom(_browser(out, tmp_path, "--dump-dom").stdout)
    rows = [e for e in dom if e["tag"] == "tr" and "data-score-mean" in e["attrs"]]
    assert sorted((e["section"], int(e["attrs"]["data-step"])) for e in rows) == sorted(want)
    for e in rows:
        scores = want[e["section"], int(e["attrs"]["data-step"])]
        assert float(e["attrs"]["data-score-mean"]) == pytest.approx(sum(scores) / len(scores), rel=1e-12)
        assert e["attrs"]["data-k3-mean"] == "" and e["attrs"]["data-gate-on"] == ""
    assert any("no teacher log-probs" in e["text"] for e in dom if e["tag"] == "p")
    texts = [e["text"] for e in dom if e["tag"] == "div" and "resp" in e["attrs"].get("class", "")]
    assert TEXTS["mobile"][1] in texts  # the last step's best-scored mobile response, verbatim
    assert not any(e["attrs"].get("id") == "chart-k3" for e in dom)


def test_mistakes_get_one_line_naming_the_option(step_dumps, tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("mine\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    two = tmp_path / "two"
    for sub in ("a", "b"):
        (two / sub).mkdir(parents=True)
        shutil.copy(step_dumps / "step_1.pt", two / sub / "step_1.pt")
    bad = tmp_path / "bad"
    bad.mkdir()
    rows = torch.load(step_dumps / "step_1.pt", weights_only=False)["rows"]
    del rows[0]["teacher"]
    torch.save({"step": 1, "rows": rows}, bad / "step_1.pt")
    cases = [
        ((step_dumps, "--out", readme), f"--out={readme}: exists and is not a verl-mopd inspect report"),
        ((step_dumps, "--out", tmp_path), f"--out={tmp_path}: is a folder"),
        ((tmp_path / "nope", "--out", tmp_path / "x.html"), "no such folder"),
        ((empty, "--out", tmp_path / "x.html"), "no dumps in it or below it: expected step_<N>.pt"),
        ((two, "--out", tmp_path / "x.html"), "2 folders below it hold step_*.pt dumps"),
        ((bad, "--out", tmp_path / "x.html"), "row 0: missing field(s) ['teacher']"),
        ((step_dumps, "--out", tmp_path / "x.html", "--top", 0), "--top=0: must be >= 1"),
        ((step_dumps, "--out", tmp_path / "x.html", "--tokenizer", tmp_path / "nope"), "--tokenizer="),
    ]
    for argv, message in cases:
        assert _inspect(*argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("verl-mopd inspect: error: ") and message in err[0], (argv, err)
    assert readme.read_text() == "mine\n" and not (tmp_path / "x.html").exists()
    # an earlier report is replaced
    out = tmp_path / "again.html"
    assert _inspect(step_dumps, "--out", out) == 0 and _inspect(step_dumps, "--out", out, "--top", 3) == 0
    assert "<id>" not in out.read_text() and "⟨" in out.read_text()  # no --tokenizer: token ids

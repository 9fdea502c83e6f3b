"""examples/reward_only: the scoring script on the sample outputs, and the README's prompt snippet."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

from verl_mopd.rewards import compute_score

HERE = Path(__file__).parents[2] / "examples" / "reward_only"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"reward_only_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_sample_scores_its_expected_level():
    rows = [json.loads(line) for line in (HERE / "outputs.jsonl").read_text().splitlines()]
    assert {r["ground_truth"]["platform"] for r in rows} == {"desktop", "mobile"}
    assert {r["expected_score"] for r in rows} == {1.0, -0.5, -1.0}  # every level, on both platforms
    for r in rows:
        assert compute_score(None, r["response"], r["ground_truth"])["score"] == r["expected_score"], r["id"]


def test_script_prints_the_per_platform_level_histogram(capsys):
    summary = _load("score_outputs").main([str(HERE / "outputs.jsonl")])
    out = capsys.readouterr().out
    assert {p: (s["correct"], s["partial"], s["invalid"]) for p, s in summary.items()} == {
        "desktop": (3, 3, 2), "mobile": (3, 2, 2), "all": (6, 5, 4)}
    lines = {line.split()[0]: line for line in out.splitlines()[-4:]}
    assert set(lines) == {"platform", "desktop", "mobile", "all"}
    assert re.search(r"desktop\s+8\s+3 #+\s+3 #+\s+2 #+\s+-0\.062\s+0\.38", lines["desktop"])


def test_script_refuses_a_line_without_ground_truth(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"response": "x"}) + "\n")
    with pytest.raises(SystemExit, match="bad.jsonl:1: needs 'response'"):
        _load("score_outputs").main([str(bad)])


def test_readme_snippet_builds_a_row_the_reward_grades():
    readme = (HERE / "README.md").read_text()
    namespace = {}
    for block in re.findall(r"```python\n(.*?)```", readme, re.S):
        exec(block, namespace)  # noqa: S102 - the README's own code must run as written
    row = namespace["row"]
    assert row["prompt"][0]["content"].count('"name": "mobile_use"') == 1
    call = ('<tool_call>{"name": "mobile_use", "arguments": {"action": "click", "coordinate": [440, 460]}}'
            "</tool_call>")
    assert compute_score(row["data_source"], call, row["reward_model"]["ground_truth"])["score"] == 1.0

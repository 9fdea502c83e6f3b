"""``verl-mopd score --file/--out``: the output is whole or absent, never an input, errors name file:line."""

import json
import os

import pytest
from _reward_helpers import call, truth

from verl_mopd import cli

GT = truth("mobile", bbox=[200, 700, 300, 800], action="click", coordinate=[250, 750])
ROWS = [
    {"response": call("mobile", action="tap", coordinate=[255, 760]), "ground_truth": GT},
    {"solution_str": call("mobile", action="click", coordinate=[900, 100]), "ground_truth": json.dumps(GT),
     "extra_info": {"id": "x"}},
]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _run(capsys, *argv):
    rc = cli.main(["score", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_scored_file_and_summary(tmp_path, capsys):
    src, out = _jsonl(tmp_path / "in.jsonl", ROWS), tmp_path / "scored.jsonl"
    rc, stdout, _ = _run(capsys, "--file", src, "--out", str(out))
    assert rc == 0 and json.loads(stdout)["all"]["n"] == 2
    scored = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["reward"]["score"] for r in scored] == [1.0, -0.5] and scored[1]["extra_info"] == {"id": "x"}
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "scored.jsonl"]


def test_a_typo_in_file_leaves_an_existing_out_untouched(tmp_path, capsys):
    out = tmp_path / "scored.jsonl"
    out.write_text("yesterday's scores\n")
    rc, _, err = _run(capsys, "--file", str(tmp_path / "typo.jsonl"), "--out", str(out))
    assert rc == 2 and "--file=" in err and "no such file" in err
    assert out.read_text() == "yesterday's scores\n"


@pytest.mark.parametrize("alias", ["same", "symlink", "hardlink"])
def test_out_naming_the_input_is_refused(tmp_path, capsys, alias):
    src = tmp_path / "in.jsonl"
    _jsonl(src, ROWS)
    before = src.read_bytes()
    out = {"same": src, "symlink": tmp_path / "link.jsonl", "hardlink": tmp_path / "hard.jsonl"}[alias]
    if alias == "symlink":
        out.symlink_to(src)
    elif alias == "hardlink":
        os.link(src, out)
    rc, stdout, err = _run(capsys, "--file", str(src), "--out", str(out))
    assert rc == 2 and "would overwrite the input" in err and stdout == ""
    assert src.read_bytes() == before


@pytest.mark.parametrize(
    "line, message",
    [
        ("{oops", "bad.jsonl:2: not JSON (Expecting property name"),
        ('["a list"]', "bad.jsonl:2: a list, expected a JSON object"),
        ('{"response": "x"}', "bad.jsonl:2: needs 'response' (or 'solution_str') and 'ground_truth'"),
        ('{"response": "x", "ground_truth": {"platform": "tv", "action": {"action": "click"}}}',
         "bad.jsonl:2: ground_truth.platform='tv'"),
    ],
)
def test_a_bad_line_is_named_and_out_keeps_its_old_content(tmp_path, capsys, line, message):
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps(ROWS[0]) + "\n" + line + "\n" + json.dumps(ROWS[1]) + "\n")
    out = tmp_path / "scored.jsonl"
    out.write_text("old\n")
    rc, _, err = _run(capsys, "--file", str(src), "--out", str(out))
    assert rc == 2 and message in err and err.count("\n") == 1
    assert out.read_text() == "old\n" and sorted(os.listdir(tmp_path)) == ["bad.jsonl", "scored.jsonl"]


def test_a_binary_file_is_named_with_its_line(tmp_path, capsys):
    src = tmp_path / "b.jsonl"
    src.write_bytes(json.dumps(ROWS[0]).encode() + b"\n\xff\xfe\x00\n")
    rc, _, err = _run(capsys, "--file", str(src))
    assert rc == 2 and "b.jsonl:2: not UTF-8 text" in err


def test_a_lone_surrogate_in_a_response_is_scored_and_written(tmp_path, capsys):
    row = {"response": "half a pair \ud83d</think>" + call("mobile", think="", action="click", coordinate=[250, 750]),
           "ground_truth": GT}
    src = tmp_path / "s.jsonl"
    src.write_text(json.dumps(row) + "\n")  # json escapes the surrogate as \ud83d
    out = tmp_path / "scored.jsonl"
    rc, _, _ = _run(capsys, "--file", str(src), "--out", str(out))
    assert rc == 0
    (back,) = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert back["response"] == row["response"] and back["reward"]["score"] == 1.0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--truth", "{not json", "x"], "--truth: not JSON (Expecting property name enclosed in double quotes"),
        (["--truth", '{"platform": "tv", "action": {"action": "click"}}', "x"], "--truth: ground_truth.platform='tv'"),
        (["--platform", "mobile", "--truth", '{"action": {"action": "click", "coordinate": [1, 1]}, "bbox": [0, 0, 5e9, 1]}',
          "x"], "--truth: ground_truth.bbox=[0, 0, 5000000000.0, 1]: outside the 0-1000 grid"),
        (["--platform", "mobile", "--truth", json.dumps(GT), "--extra-info", "[1]", "x"],
         "--extra-info: a JSON list, expected an object"),
        (["--platform", "mobile", "--truth", json.dumps(GT), "--extra-info", "{bad", "x"], "--extra-info: not JSON"),
        (["--truth", json.dumps(GT)], "give a response and --truth, or --file"),
        (["--truth", json.dumps(GT), "--out", "o.jsonl", "x"], "--out needs --file"),
    ],
)
def test_option_mistakes_are_one_line_naming_the_option(capsys, argv, message):
    rc, out, err = _run(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.startswith("verl-mopd score: error: ") and message in err and err.count("\n") == 1

"""The verl-mopd command line: every command is reachable, only its own module is imported."""

import json
import pathlib
import subprocess
import sys

import pytest

from verl_mopd import cli

SMALL = str(pathlib.Path(__file__).parents[1] / "recipes" / "ui_mopd" / "stage2_mopd_small.yaml")


def test_help_lists_every_command_and_imports_nothing_heavy():
    code = ("import sys; from verl_mopd import cli; p = cli.build_parser('x'); "
            "print(sorted(m for m in ('torch', 'verl', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr
    for name in ("check", "demo", "score", "prepare", "eval", "validate-recipe"):
        assert name in cli.COMMANDS
        cli.build_parser(name)  # the command's own arguments load


def test_score_command(capsys):
    truth = json.dumps({"platform": "mobile", "action": {"action": "click", "coordinate": [450, 450]},
                        "bbox": [400, 400, 500, 500]})
    response = '</think><tool_call>{"name": "mobile_use", "arguments": {"action": "tap", "coordinate": [505, 450]}}</tool_call>'
    assert cli.main(["score", "--truth", truth, response]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["score"] == 1.0 and result["acc"] == 1.0


def test_validate_recipe_command_exit_codes(tmp_path, capsys):
    assert cli.main(["validate-recipe", SMALL]) == 0
    assert cli.main(["validate-recipe", SMALL, "+mopd.tau_k1=0.5"]) == 1
    assert "mopd.tau_k1: unknown key; did you mean mopd.tau_kl?" in capsys.readouterr().err
    assert cli.main(["validate-recipe", str(tmp_path / "nope.yaml")]) == 2


def test_unknown_command_is_an_argparse_error():
    with pytest.raises(SystemExit):
        cli.main(["train"])

"""What a new user meets first: commands that answer without importing verl, the versions, a typo
named with its nearest command, help on every option, and no third-party noise before an error."""

import argparse
import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

import pytest

from verl_mopd import __version__, cli

ROOT = Path(__file__).parents[1]
SMALL = ROOT / "recipes" / "ui_mopd" / "stage2_mopd_small.yaml"
HEAVY = ("torch", "verl", "transformers", "ray", "megatron")
TRUTH = '{"platform": "mobile", "action": {"action": "click", "coordinate": [450, 450]}, "bbox": [400, 400, 500, 500]}'
CALL = '</think><tool_call>{"name": "mobile_use", "arguments": {"action": "tap", "coordinate": [505, 450]}}</tool_call>'


def _run(*argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "verl_mopd.cli", *argv], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def _imported(importtime_stderr: str) -> set[str]:
    """Top-level packages imported by the process (``-X importtime`` lists every module)."""
    return {m.group(1).strip().split(".")[0]
            for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)$", importtime_stderr, re.M)}


@pytest.mark.parametrize("argv, code", [
    (["--help"], 0),
    (["--version"], 0),
    (["dmeo"], 2),
    (["score", "--help"], 0),
    (["demo", "--help"], 0),
    (["score", "--truth", TRUTH, CALL], 0),
    (["validate-recipe", "recipes/ui_mopd/_stage2_ui_mopd.yaml"], 2),
])
def test_these_commands_answer_without_importing_verl_or_torch(argv, code):
    out = _run(*argv)
    assert out.returncode == code, out.stderr[-2000:]
    imported = _imported(out.stderr)
    assert "verl_mopd" in imported  # the parse works: -X importtime reported the imports
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))


def test_version_names_verl_mopd_and_verl(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"verl-mopd {__version__} (verl {md.version('verl')})"


@pytest.mark.parametrize("typo, nearest", [("dmeo", "demo"), ("scroe", "score"), ("validate", "validate-recipe"),
                                           ("evl", "eval")])
def test_a_mistyped_command_names_the_nearest_one(capsys, typo, nearest):
    with pytest.raises(SystemExit) as exit_:
        cli.main([typo])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert f"unknown command {typo!r}; did you mean {nearest!r}?" in err.splitlines()[-1]


def test_a_command_far_from_every_real_one_gets_the_list_only(capsys):
    with pytest.raises(SystemExit):
        cli.main(["xyzzy"])
    last = capsys.readouterr().err.splitlines()[-1]
    assert "did you mean" not in last and "(commands: check, demo, score" in last


def _options(parser: argparse.ArgumentParser, where: str):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{where} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield where, action


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_option_has_help_that_says_more_than_its_name(command):
    parser = cli.build_parser(command)
    for where, action in _options(parser, "verl-mopd"):
        text = re.sub(r"\s*\(default: [^)]*\)$", "", action.help or "").strip()
        name = action.dest.replace("_", " ")
        assert text and text.replace("_", " ") != name, f"{where} {action.option_strings or action.dest}: {action.help!r}"
        assert "(default: )" not in action.help, f"{where} {action.option_strings}: {action.help!r}"


def test_every_command_has_a_description():
    parser = cli.build_parser(None)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        assert p.description == cli.COMMANDS[name][0], name


def test_a_mistyped_key_names_the_nearest_key_and_the_error_is_the_first_line():
    """Run as the user does (a fresh process, verl imported): no library warning comes before the error."""
    out = _run("validate-recipe", str(SMALL.relative_to(ROOT)), "mopd.tau_k=0.3", "actor_rollout_ref.rollout.n=8")
    lines = [line for line in out.stderr.splitlines() if not line.startswith("import time:")]
    assert out.returncode == 1
    assert lines == [f"{SMALL.relative_to(ROOT)}: cannot compose: mopd.tau_k is not a key of this recipe "
                     "(mopd.tau_k=0.3); did you mean mopd.tau_kl?"], lines
    assert "verl" in _imported(out.stderr)  # the quiet path is the real one: verl was imported


NO_CUDA = "No CUDA runtime is found"


def _cuda_toolkit_env(tmp_path: Path) -> dict:
    """A CPU machine with a CUDA toolkit, as torch sees one: ``CUDA_HOME`` names an existing folder."""
    import os

    import torch

    if torch.cuda.is_available():
        pytest.skip("torch logs 'No CUDA runtime is found' only where it sees no CUDA device")
    return {**os.environ, "CUDA_HOME": str(tmp_path)}


def test_torch_no_cuda_runtime_warning_is_hidden_by_the_command_line(tmp_path):
    """`verl-mopd check` imports megatron-core, which imports torch.utils.cpp_extension: without the filter
    torch logs "No CUDA runtime is found, using CUDA_HOME=..." (the control shows it does here)."""
    pytest.importorskip("megatron.core", reason="the tour's install (megatron-core) imports torch.utils.cpp_extension")
    env = _cuda_toolkit_env(tmp_path)
    env.pop("TORCH_LOGS", None)
    control = subprocess.run([sys.executable, "-c", "import torch.utils.cpp_extension"], capture_output=True,
                             text=True, timeout=300, env=env, check=False)
    assert NO_CUDA in control.stderr, control.stderr[-2000:]
    out = subprocess.run([sys.executable, "-m", "verl_mopd.cli", "check"], capture_output=True, text=True,
                         timeout=300, cwd=ROOT, env=env, check=False)
    assert "megatron-core" in out.stdout, out.stdout[-2000:]  # the check did import it
    assert NO_CUDA not in out.stderr, out.stderr[-2000:]


def test_the_processes_the_command_line_starts_get_torch_logs_for_the_warning():
    from verl_mopd.quiet import torch_logs

    assert torch_logs(None) == "-torch.utils.cpp_extension"
    assert torch_logs("+dynamo") == "+dynamo,-torch.utils.cpp_extension"
    assert torch_logs(torch_logs("+dynamo")) == torch_logs("+dynamo")  # idempotent
    assert torch_logs("+torch.utils.cpp_extension") == "+torch.utils.cpp_extension"  # the user's choice stands

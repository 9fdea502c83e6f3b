"""The one error boundary of ``verl-mopd``: a user mistake is one line and exit 2; a bug keeps its traceback."""

import re
import subprocess
import sys

import pytest

from verl_mopd import cli
from verl_mopd.errors import UsageError


def _raise_usage(args):
    raise UsageError("--thing=7: must be even")


def _raise_missing_file(args):
    open("/nonexistent/dir/data.jsonl")


def _raise_systemexit_text(args):
    raise SystemExit("--limit needs --data")


def _raise_interrupt(args):
    raise KeyboardInterrupt


def _raise_bug(args):
    return {}["missing"]


def _raise_encode_bug(args):
    "\ud800".encode("utf-8")  # a ValueError, but writing our own text: a bug


@pytest.fixture
def fake_command(monkeypatch):
    def install(fn):
        commands = {**cli.COMMANDS, "fake": ("a test command", None, f"{__name__}:{fn.__name__}")}
        monkeypatch.setattr(cli, "COMMANDS", commands)

    return install


@pytest.mark.parametrize(
    "fn, code, message",
    [
        (_raise_usage, 2, "verl-mopd fake: error: --thing=7: must be even"),
        (_raise_missing_file, 2, "verl-mopd fake: error: /nonexistent/dir/data.jsonl: No such file or directory"),
        (_raise_systemexit_text, 2, "verl-mopd fake: error: --limit needs --data"),
        (_raise_interrupt, 130, "verl-mopd fake: interrupted"),
    ],
)
def test_user_errors_are_one_line_with_their_exit_code(fake_command, capsys, fn, code, message):
    fake_command(fn)
    assert cli.main(["fake"]) == code
    err = capsys.readouterr().err
    assert err == message + "\n"


def test_debug_anywhere_or_in_the_environment_shows_the_traceback(fake_command, capsys, monkeypatch):
    fake_command(_raise_usage)
    assert cli.main(["--debug", "fake"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.endswith("verl-mopd fake: error: --thing=7: must be even\n")
    monkeypatch.setenv("VERL_MOPD_DEBUG", "1")
    assert cli.main(["fake"]) == 2
    assert "Traceback" in capsys.readouterr().err
    fake_command(_raise_interrupt)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["fake"])


@pytest.mark.parametrize("fn, kind", [(_raise_bug, KeyError), (_raise_encode_bug, UnicodeEncodeError)])
def test_a_bug_is_not_disguised_as_a_user_error(fake_command, capsys, fn, kind):
    fake_command(fn)
    with pytest.raises(kind):
        cli.main(["fake"])
    assert "internal error" in capsys.readouterr().err


def test_the_installed_command_prints_no_traceback(tmp_path):
    env_cmd = [sys.executable, "-m", "verl_mopd.cli", "score", "--platform", "mobile", "--truth", "{not json", "x"]
    out = subprocess.run(env_cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines()[-1].startswith("verl-mopd score: error: --truth: not JSON")
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--reward-kwargs", "{bad"], "--reward-kwargs: not JSON"),
        (["--reward-kwargs", "[1]"], "--reward-kwargs='[1]': must be a JSON object"),
        (["--reward-kwargs", '{"bbox_scale": "big"}'], "--reward-kwargs: bbox_scale='big': must be a finite number"),
        (["--mode", "ui_mopd", "--preset", "aitw"], "--mode ui_mopd reproduces the release"),
        (["--max-in-flight", "0"], "--max-in-flight=0: must be >= 1"),
    ],
)
def test_eval_offline_option_mistakes(tmp_path, capsys, extra, message):
    data = tmp_path / "d.parquet"
    data.write_bytes(b"PAR1")
    rc = cli.main(["eval", "offline", "--data", str(data), "--out", str(tmp_path / "o"), "--base-url",
                   "http://127.0.0.1:9/v1", "--model", "m", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "data, message",
    [("missing.parquet", "--data=.*missing.parquet: no such file or folder"),
     ("corrupt.parquet", "corrupt.parquet: not a readable parquet file"),
     ("empty_dir", "no .parquet files in the folder")],
)
def test_eval_offline_data_mistakes(tmp_path, capsys, data, message):
    (tmp_path / "corrupt.parquet").write_bytes(b"PAR1 truncated")
    (tmp_path / "empty_dir").mkdir()
    rc = cli.main(["eval", "offline", "--data", str(tmp_path / data), "--out", str(tmp_path / "o"),
                   "--base-url", "http://127.0.0.1:9/v1", "--model", "m"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and re.search(message, err), err


def test_eval_merge_missing_model_is_a_user_error(tmp_path, capsys):
    rc = cli.main(["eval", "merge", "--method", "average", "--models", str(tmp_path / "a"), str(tmp_path / "b"),
                   "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err
    assert rc == 2 and "no model.safetensors" in err and not (tmp_path / "m").exists()

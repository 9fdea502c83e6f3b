"""verl-mopd's subcommands as functions, through the one CLI entry point (``verl_mopd.cli.main``,
with its error boundary), for tests that call a command in-process."""

from verl_mopd import cli


def prepare(argv: list[str]) -> int:
    """``verl-mopd prepare ARGV``; returns the exit code."""
    return cli.main(["prepare", *argv])


def demo(argv: list[str]) -> int:
    """``verl-mopd demo ARGV``; returns the exit code."""
    return cli.main(["demo", *argv])


def eval_(argv: list[str]) -> int:
    """``verl-mopd eval ARGV``; returns the exit code."""
    return cli.main(["eval", *argv])

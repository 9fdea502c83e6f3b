"""Known third-party noise, hidden by the ``verl-mopd`` command line unless ``--debug``.

On a machine without Transformer Engine, Apex or a GPU, importing verl prints about 20 lines that
say nothing about the user's run: verl lists the optional engines it could not import,
megatron-core says it falls back from Transformer Engine / Apex, verl's platform manager says
there is no accelerator; and verl's configs say what they turned off for GRPO or TP=1 each time one
is built. Each entry below names one such message and where it comes from, so any other warning
still shows.

One of them is logged in every process that imports megatron-core (it imports
``torch.utils.cpp_extension``): torch's "No CUDA runtime is found, using CUDA_HOME=..." on a CPU
machine that has a CUDA toolkit. The command line drops it with a logging filter in its own process,
and in the processes it starts (verl's trainers, their Ray workers) through torch's own log setting,
``TORCH_LOGS=-torch.utils.cpp_extension`` (that module at level ERROR; :func:`torch_logs`), which
:func:`verl_mopd.testing.cpu.environment` also sets for every worker of the CPU harness.
"""

from __future__ import annotations

import logging
import os
import warnings

__all__ = ["KNOWN_WARNINGS", "KNOWN_LOG_RECORDS", "QUIET_TORCH_LOGS", "hide_known_warnings", "torch_logs"]

#: (category, message regex, module regex) as :func:`warnings.filterwarnings` takes them
KNOWN_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    # verl/workers/engine/__init__.py: torchtitan, veomni, automodel, ... not installed
    (UserWarning, r".* engine is not available", r"verl\.workers\.engine"),
    # megatron-core without Transformer Engine / Apex (the CPU test stack)
    (UserWarning, r"(Transformer Engine and )?Apex (is|are) not installed", r"megatron\."),
    # verl.trainer.ppo.utils.need_critic on every GRPO config (stacklevel=2: the caller's module)
    (UserWarning, r"Disabled critic as algorithm\.adv_estimator != gae", r""),
    # verl/workers/config/engine.py McoreEngineConfig, on every TP=1 Megatron config (stacklevel=2)
    (UserWarning, r"set sequence parallel to false as TP size is 1", r""),
    # hydra, about multi-storage-client's config source (below) that has no profile here
    (UserWarning, r"provider=msc-universal, path=.* is not available", r"hydra\."),
)

#: logger name -> message prefixes of its records to drop (verl formats them with %-args)
KNOWN_LOG_RECORDS: dict[str, tuple[str, ...]] = {
    "verl.plugin.platform.platform_manager": (
        "No supported accelerator detected",
        "Platform '%s' (%s) is registered but not available",
    ),
    # multi-storage-client (megatron-energon's, which Megatron-Bridge imports) registers a hydra config
    # source that logs an ERROR with a traceback at every hydra compose when no MSC profile exists
    "multistorageclient.contrib.hydra": ("MSC config source not available",),
    # torch/utils/cpp_extension.py at import (megatron-core imports it) on a CPU machine with a CUDA toolkit
    "torch.utils.cpp_extension": ("No CUDA runtime is found",),
}

#: torch's loggers that a process started by verl-mopd runs at level ERROR (``TORCH_LOGS`` syntax: ``-name``)
QUIET_TORCH_LOGS: tuple[str, ...] = ("torch.utils.cpp_extension",)


def torch_logs(current: str | None = None) -> str:
    """``TORCH_LOGS`` for a child process: ``current`` (the user's setting) plus ``-name`` for each logger of
    :data:`QUIET_TORCH_LOGS` that it does not name already (idempotent)."""
    parts = [p.strip() for p in (current or "").split(",") if p.strip()]
    named = {p.lstrip("+-") for p in parts}
    return ",".join(parts + [f"-{name}" for name in QUIET_TORCH_LOGS if name not in named])


class _DropKnown(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno < logging.CRITICAL and str(record.msg).startswith(self.prefixes))


def hide_known_warnings() -> None:
    """Install the filters of this module for this process, and :func:`torch_logs` in ``os.environ`` for the
    processes it starts (idempotent)."""
    os.environ["TORCH_LOGS"] = torch_logs(os.environ.get("TORCH_LOGS"))
    for category, message, module in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, prefixes in KNOWN_LOG_RECORDS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnown) for f in logger.filters):
            logger.addFilter(_DropKnown(prefixes))

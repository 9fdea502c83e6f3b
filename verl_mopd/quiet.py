"""Known third-party noise, hidden by the ``verl-mopd`` command line unless ``--debug``.

On a machine without Transformer Engine, Apex or a GPU, importing verl prints about 20 lines that
say nothing about the user's run: verl lists the optional engines it could not import,
megatron-core says it falls back from Transformer Engine / Apex, verl's platform manager says
there is no accelerator; and verl's configs say what they turned off for GRPO or TP=1 each time one
is built. Each entry below names one such message and where it comes from, so any other warning
still shows.
"""

from __future__ import annotations

import logging
import warnings

__all__ = ["KNOWN_WARNINGS", "KNOWN_LOG_RECORDS", "hide_known_warnings"]

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
}


class _DropKnown(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno < logging.CRITICAL and str(record.msg).startswith(self.prefixes))


def hide_known_warnings() -> None:
    """Install the filters of this module for this process (idempotent)."""
    for category, message, module in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, prefixes in KNOWN_LOG_RECORDS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnown) for f in logger.filters):
            logger.addFilter(_DropKnown(prefixes))

"""Registration of verl-mopd into verl's registries (the only global state we touch).

``register()`` is idempotent. It runs automatically in every process that imports verl through
the ``verl.plugins`` entry point declared in ``setup.py`` (``verl/__init__.py`` loads that group
unless ``VERL_USE_EXTERNAL_PLUGINS=none``); call it yourself in a custom trainer.

It imports nothing of verl's: each registry is filled when verl's module that holds it is
imported (at once when it already is), so ``import verl`` stays as fast as verl alone, and every
process that can look a name up has it. verl looks names up only through those modules.
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
import threading
import warnings
from collections.abc import Callable

def _register_loss() -> None:
    from verl_mopd.verl_loss import register_loss

    register_loss()


def _register_trainers() -> None:
    """The ``mopd_*`` v1 trainers into verl's ``TRAINER_REGISTRY`` (``register_trainer`` on import)."""
    import verl_mopd.trainer.mopd_trainer  # noqa: F401


#: verl package whose import fills a registry -> what fills it. The packages, not the registry
#: modules: a package's ``__init__`` imports its registry module and the base classes our
#: subclasses need, so both are complete when it is.
REGISTRIES: dict[str, Callable[[], None]] = {
    "verl.trainer.distillation": _register_loss,  # DISTILLATION_LOSS_REGISTRY (verl_loss.py)
    "verl.trainer.ppo.v1": _register_trainers,  # TRAINER_REGISTRY (trainer_base.py)
}


def register() -> None:
    """Register verl-mopd into verl's registries, and correct what the recipes need corrected upstream.

    - distillation loss mode ``mopd_k3`` (:func:`verl_mopd.verl_loss.register_loss`, which lives with
      the loss it registers), so ``distillation.distillation_loss.loss_mode=mopd_k3`` selects it in
      any verl run;
    - the v1 trainers ``mopd_sync`` / ``mopd_separate_async`` / ``mopd_colocate_async``
      (``trainer.v1.trainer_mode``), through verl's ``register_trainer`` (importing
      ``verl_mopd.trainer.mopd_trainer`` does it; verl's TaskRunner looks them up by name).

    - the corrections of :mod:`verl_mopd.upstream_fixes` (Megatron-Bridge's Qwen3-VL vision gradients
      under TP + sequence parallel), each right after its module's first import.

    A registry whose verl package is already imported is filled now (a failure raises);
    otherwise right after that package is first imported (a failure is warned about, since
    raising would break verl's own import, and ``require_registered`` reports it).
    """
    from verl_mopd.upstream_fixes import FIXES

    for package, fill in {**REGISTRIES, **FIXES}.items():
        after_import(package, fill)


def after_import(name: str, callback: Callable[[], None], *, strict: bool = False) -> None:
    """Run ``callback`` once module ``name`` is imported: now if it is, else right after its first import.

    A failing callback is warned about (raising would fail the import of ``name``, verl's own), unless
    ``strict``: then it raises, and the import that ran it fails with it (the CPU test harness's hooks).
    """
    if name in sys.modules:
        callback()
        return
    with _HOOK.lock:
        _HOOK.pending.setdefault(name, [])
        if callback not in _HOOK.pending[name]:
            _HOOK.pending[name].append(callback)
        if strict:
            _HOOK.strict.add(callback)
        if _HOOK not in sys.meta_path:
            sys.meta_path.insert(0, _HOOK)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a pending module it wraps the spec the other finders return so that
    the callbacks run right after the module's code, then it forgets the module."""

    def __init__(self) -> None:
        self.pending: dict[str, list[Callable[[], None]]] = {}
        self.strict: set[Callable[[], None]] = set()
        self.lock = threading.Lock()

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.pending:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenRun(spec.loader, lambda: self._run(fullname))
        return spec

    def _run(self, fullname: str) -> None:
        with self.lock:
            callbacks = self.pending.pop(fullname, [])
            if not self.pending and self in sys.meta_path:
                sys.meta_path.remove(self)
        for callback in callbacks:
            if callback in self.strict:
                self.strict.discard(callback)
                callback()
                continue
            try:
                callback()
            except Exception as exc:  # noqa: BLE001 - raising would fail verl's import of `fullname`
                message = ("verl-mopd plugin failed to register (loss_mode=mopd_k3 or the mopd_* trainers "
                           f"unavailable): {type(exc).__name__}: {exc}")
                logging.getLogger("verl_mopd").warning(message)
                warnings.warn(message, RuntimeWarning, stacklevel=2)


class _ThenRun(importlib.abc.Loader):
    """The wrapped loader, then ``after()`` once the module's code has run."""

    def __init__(self, loader, after: Callable[[], None]) -> None:
        self._loader, self._after = loader, after

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._after()

    def __getattr__(self, name):  # get_resource_reader, get_filename, ... of the real loader
        return getattr(self._loader, name)


_HOOK = _AfterImport()

"""Writing output files so that a crash or a typo never costs the user a file.

- :func:`atomic_write`: write beside the target under a temporary name, flush and fsync, then
  ``os.replace`` (atomic on POSIX): readers see the old file or the new one, never a torn one,
  and a failure leaves the old file untouched and no temporary behind.
- :func:`refuse_overwrite`: an output path that is one of the inputs (also through a symlink or
  a hard link) is refused before anything is opened.
- :func:`json_text` / :func:`json_line`: JSON that always encodes as UTF-8 (a lone surrogate in
  model text is written as a ``\\udXXX`` escape instead of failing the write).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from typing import IO, Any

from verl_mopd.errors import UsageError

__all__ = ["atomic_write", "json_line", "json_text", "refuse_overwrite"]


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """``with atomic_write(path) as f: ...`` writes ``path`` whole or not at all."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(path):  # keep the permissions the user gave the file
            os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def refuse_overwrite(
    out: str | os.PathLike, inputs: Iterable[str | os.PathLike | None], option: str, *, replaces_folder: bool = False
) -> None:
    """Raise :class:`UsageError` when writing ``out`` would replace one of ``inputs``.

    The same path (also through a symlink or a hard link) is refused. With ``replaces_folder``
    (the command replaces the folder ``out`` as a whole), an input inside ``out`` and an ``out``
    inside an input are refused too. ``option`` names the output option in the message.
    """
    out = os.fspath(out)
    real_out = os.path.realpath(out)
    for inp in inputs:
        if inp is None:
            continue
        inp = os.fspath(inp)
        real_in = os.path.realpath(inp)
        clash = real_in == real_out or (os.path.exists(out) and os.path.exists(inp) and _same(out, inp))
        if replaces_folder and not clash:
            clash = _inside(real_in, real_out) or _inside(real_out, real_in)
        if clash:
            raise UsageError(f"{option}={out}: would overwrite the input {inp}; write somewhere else")


def _inside(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip(os.sep) + os.sep)


def json_text(obj: Any, indent: int | None = None) -> str:
    """``json.dumps(obj, ensure_ascii=False)``, falling back to ASCII escapes when the text holds
    characters UTF-8 cannot encode (lone surrogates), so writing it can never fail."""
    text = json.dumps(obj, ensure_ascii=False, indent=indent)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(obj, indent=indent)
    return text


def json_line(obj: Any) -> str:
    """One JSONL line (:func:`json_text` plus a newline)."""
    return json_text(obj) + "\n"

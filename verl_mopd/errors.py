"""The exception for user mistakes, and which exceptions the ``verl-mopd`` command line reports as such.

Raise :class:`UsageError` for a mistake the user can fix: a bad option value, a missing or
malformed input file, a line that does not parse. Its message is one line that names the option
(``--truth: ...``) or the place (``rollouts.jsonl:12: ...``) and says what is allowed.

``verl-mopd`` (:func:`verl_mopd.cli.main`) is the one error boundary. It prints
``verl-mopd <command>: error: <message>`` on stderr and exits with code 2 for

- :class:`UsageError` (a ``ValueError``, so library callers may catch either);
- any other ``ValueError`` (our config dataclasses and readers raise it with a sentence that
  names the field), ``UnicodeDecodeError`` and ``json.JSONDecodeError`` included (but not
  ``UnicodeEncodeError``: failing to write text we produced is a bug);
- ``OSError`` that names its file (``filename`` set, as ``open`` sets it), and
  ``FileNotFoundError`` / ``IsADirectoryError`` / ``PermissionError`` / ... raised with a message;
- ``SystemExit`` raised with a message string (the argparse convention for usage errors).

Anything else is a bug: its traceback is shown. ``--debug`` (anywhere on the command line) or
``VERL_MOPD_DEBUG=1`` shows the traceback of user errors too. Ctrl-C exits with 130, no traceback.
"""

from __future__ import annotations

__all__ = ["ConfigError", "UsageError", "user_error_message"]

_FILE_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError)


class UsageError(ValueError):
    """A mistake the user can fix; the message names the option or ``file:line``."""


class ConfigError(ValueError):
    """Every problem found in a config, one line each (the key, the value, what is allowed).

    The one config error of verl-mopd (torchtune's ``ConfigError`` habit): the ``mopd`` block, the
    teachers and ``validate-recipe`` collect all their problems and raise them together, so a user
    fixes a recipe in one pass. ``errors`` holds the lines; ``what`` names the config in the message.
    """

    def __init__(self, errors: list[str], what: str = "config"):
        self.errors = list(errors)
        self.what = what
        super().__init__(f"invalid {what}:\n  - " + "\n  - ".join(self.errors))


def user_error_message(exc: BaseException) -> str | None:
    """The one-line report of a user error, or None when ``exc`` is not one (a bug)."""
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, str) and exc.code else None
    if isinstance(exc, OSError):
        if exc.filename is not None:
            name = exc.filename if exc.filename2 is None else f"{exc.filename} -> {exc.filename2}"
            return f"{name}: {exc.strerror or type(exc).__name__}"
        if isinstance(exc, _FILE_ERRORS) and len(exc.args) == 1 and isinstance(exc.args[0], str):
            return exc.args[0]  # raise FileNotFoundError(f"{path}: ...") names the file in its message
        return None
    if isinstance(exc, UnicodeEncodeError):
        return None  # writing text we produced: always our bug, never the user's input
    if isinstance(exc, ValueError):
        message = str(exc).strip()
        return message or None
    return None

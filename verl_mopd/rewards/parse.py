"""Tolerant parser: model text -> :class:`~verl_mopd.rewards.actions.Action` or :class:`ParseError`.

What real Qwen3-VL output looks like (Qwen-Agent's ``computer_use`` / ``mobile_use`` tools and
the Qwen3-VL cookbooks), and what we accept:

1. Thinking. Qwen3-VL Thinking templates put ``<think>`` in the prompt, so a response often holds
   only ``</think>``. We parse only the text after the LAST ``</think>`` (or ``</thinking>``); a
   ``<think>`` left open in that text means the call sits inside an unfinished thought, which
   Qwen-Agent never executes: unparseable.
2. The call. ``<tool_call>{...}</tool_call>`` (a final unclosed block allowed, as when
   generation stops at the closing tag), else a fenced or bare JSON object with ``name`` and
   ``arguments``. The FIRST call is taken when there are several (MobileWorld, Qwen's cookbook
   agents and the UI-MOPD release do so); ``multiple_calls="reject"`` makes several calls
   unparseable instead.
3. Decoding. ``json`` first (fast path), then a small tolerant decoder in the spirit of the
   json5 decoding Qwen-Agent uses: single-quoted strings, trailing commas, bare identifier keys,
   Python literals (``True``/``None``), ``+1``/``.5`` numbers. Trailing text after the object is
   ignored. ``arguments`` may itself be a JSON string.
4. Validation against the platform's action table (:func:`~verl_mopd.rewards.actions.normalize_action`).

Input longer than ``max_chars`` is rejected before any scan. Nothing here raises on any input
string: every failure is a :class:`ParseError` with a machine-readable ``reason``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from verl_mopd.rewards.actions import TOOL_NAMES, Action, ActionError, check_platform, normalize_action

_OPEN_CALL, _CLOSE_CALL = "<tool_call>", "</tool_call>"
_MULTIPLE = ("first", "reject")
_DECODER = json.JSONDecoder()
_MAX_BARE_ATTEMPTS = 16  # '{' positions tried when there are no tags
_MAX_DEPTH = 32  # nesting limit of the tolerant decoder

# Stable reason tags (the scorer reports them; ActionError adds its own, see actions.py).
PARSE_REASONS = (
    "not_text",
    "too_long",
    "unclosed_think",
    "no_call",
    "invalid_json",
    "bad_call",
    "wrong_tool",
    "multiple_calls",
)


@dataclass(frozen=True)
class ParseConfig:
    """Parser options (settable from ``custom_reward_function.reward_kwargs``).

    Attributes:
        max_chars: longer responses are rejected (``too_long``) without being scanned.
        multiple_calls: ``"first"`` takes the first call; ``"reject"`` makes several calls
            unparseable (``multiple_calls``).
        action_aliases: accept action-name aliases (``tap`` -> ``click``). Key, button and
            status aliases are always resolved.
        lenient_json: fall back to the tolerant decoder when ``json`` fails.
    """

    max_chars: int = 262_144
    multiple_calls: str = "first"
    action_aliases: bool = True
    lenient_json: bool = True

    def __post_init__(self):
        if not (isinstance(self.max_chars, int) and self.max_chars > 0):
            raise ValueError(f"max_chars={self.max_chars!r}: must be a positive int")
        if self.multiple_calls not in _MULTIPLE:
            raise ValueError(f"multiple_calls={self.multiple_calls!r}: allowed {list(_MULTIPLE)}")


DEFAULT_PARSE_CONFIG = ParseConfig()


@dataclass(frozen=True)
class ParseError:
    """Why a response is unparseable. ``reason`` is one of :data:`PARSE_REASONS` or an
    :class:`~verl_mopd.rewards.actions.ActionError` reason; ``field`` names the argument at fault."""

    reason: str
    message: str
    field: str = ""

    def __bool__(self) -> bool:  # so that `if parsed:` reads as "parsed successfully"
        return False


# ----------------------------------------------------------------------------- thinking


def find_tag(text: str, tag: str, start: int = 0) -> int:
    """``text.find(tag, start)`` for a ``tag`` that begins with ``<``, faster where ``<`` is rare.

    A one-character ``str.find`` is a ``memchr``, an order of magnitude faster than a
    multi-character search: it jumps to the first ``<`` (in a model response, usually the
    ``</think>`` after a long reasoning), then searches the rest, hopping ``<`` to ``<`` while the
    rest is long and handing over to ``str.find`` after :data:`_LT_HOPS` misses. Same result as
    ``str.find`` for every input.
    """
    i = text.find("<", start)
    hops = _LT_HOPS
    while i >= 0 and len(text) - i > _SHORT:
        if text.startswith(tag, i):
            return i
        hops -= 1
        if hops == 0:
            break
        i = text.find("<", i + 1)
    return -1 if i < 0 else text.find(tag, i)


_LT_HOPS = 8  # '<' hops before a plain search
_SHORT = 256  # a rest this short is searched plainly


def think_tag(text: str, closing: bool, start: int = 0) -> tuple[int, int]:
    """``(start, end)`` of the first ``<think>``/``<thinking>`` (``closing``: ``</think>``/``</thinking>``)
    at or after ``start``, or ``(-1, -1)``."""
    prefix = "</think" if closing else "<think"
    i = find_tag(text, prefix, start)
    while i >= 0:
        j = i + len(prefix)
        if text.startswith(">", j):
            return i, j + 1
        if text.startswith("ing>", j):
            return i, j + 4
        i = find_tag(text, prefix, j)
    return -1, -1


def _last_close_think(text: str) -> int:
    """End index of the last ``</think>`` / ``</thinking>``, or -1."""
    i = text.rfind("</think")
    while i >= 0:  # "</think" cannot overlap itself, so the next candidate ends before i
        if text.startswith(">", i + 7):
            return i + 8
        if text.startswith("ing>", i + 7):
            return i + 11
        i = text.rfind("</think", 0, i)
    return -1


def strip_thinking(text: str) -> str | ParseError:
    """The text after the last closing think tag; a ``ParseError`` if a think is left open."""
    end = _last_close_think(text)
    rest = text if end < 0 else text[end:]
    if "<think" in rest and think_tag(rest, closing=False)[0] >= 0:
        return ParseError("unclosed_think", "a <think> block is not closed before the tool call")
    return rest


# ----------------------------------------------------------------------------- JSON decoding


class _Lenient:
    """Recursive-descent decoder for JSON with single quotes, trailing commas, identifier keys and
    Python literals. Only runs when ``json`` fails; input is bounded by ``max_chars``."""

    __slots__ = ("s", "n")

    _LITERALS = {
        "true": True,
        "false": False,
        "null": None,
        "True": True,
        "False": False,
        "None": None,
        "NaN": float("nan"),
        "Infinity": float("inf"),
    }
    _ESC = {'"': '"', "'": "'", "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}

    def __init__(self, s: str):
        self.s = s
        self.n = len(s)

    def ws(self, i: int) -> int:
        s, n = self.s, self.n
        while i < n and s[i] in " \t\r\n":
            i += 1
        return i

    def value(self, i: int, depth: int) -> tuple[Any, int]:
        if depth > _MAX_DEPTH:
            raise ValueError("nesting too deep")
        i = self.ws(i)
        if i >= self.n:
            raise ValueError("unexpected end")
        c = self.s[i]
        if c == "{":
            return self.obj(i + 1, depth + 1)
        if c == "[":
            return self.arr(i + 1, depth + 1)
        if c == '"' or c == "'":
            return self.string(i)
        if c in "+-.0123456789":
            return self.number(i)
        j = self.ident_end(i)
        word = self.s[i:j]
        if word in self._LITERALS:
            return self._LITERALS[word], j
        raise ValueError(f"unexpected {c!r} at {i}")

    def ident_end(self, i: int) -> int:
        s, n = self.s, self.n
        while i < n and (s[i].isalnum() or s[i] in "_$"):
            i += 1
        return i

    def obj(self, i: int, depth: int) -> tuple[dict, int]:
        out: dict[str, Any] = {}
        s = self.s
        while True:
            i = self.ws(i)
            if i >= self.n:
                raise ValueError("unclosed object")
            if s[i] == "}":
                return out, i + 1
            if s[i] in "\"'":
                key, i = self.string(i)
            else:
                j = self.ident_end(i)
                if j == i:
                    raise ValueError(f"bad key at {i}")
                key, i = s[i:j], j
            i = self.ws(i)
            if i >= self.n or s[i] != ":":
                raise ValueError(f"expected ':' at {i}")
            out[key], i = self.value(i + 1, depth)
            i = self.ws(i)
            if i < self.n and s[i] == ",":
                i += 1
            elif i < self.n and s[i] == "}":
                return out, i + 1
            else:
                raise ValueError(f"expected ',' or '}}' at {i}")

    def arr(self, i: int, depth: int) -> tuple[list, int]:
        out: list[Any] = []
        s = self.s
        while True:
            i = self.ws(i)
            if i >= self.n:
                raise ValueError("unclosed array")
            if s[i] == "]":
                return out, i + 1
            v, i = self.value(i, depth)
            out.append(v)
            i = self.ws(i)
            if i < self.n and s[i] == ",":
                i += 1
            elif i < self.n and s[i] == "]":
                return out, i + 1
            else:
                raise ValueError(f"expected ',' or ']' at {i}")

    def string(self, i: int) -> tuple[str, int]:
        s = self.s
        quote = s[i]
        i += 1
        parts: list[str] = []
        while True:  # str.find to the closing quote and to each escape before it
            q = s.find(quote, i)
            if q < 0:
                raise ValueError("unclosed string")
            b = s.find("\\", i, q)
            if b < 0:
                parts.append(s[i:q])
                return "".join(parts), q + 1
            parts.append(s[i:b])
            e = s[b + 1]  # b < q, so there is one
            if e == "u":
                h = s[b + 2 : b + 6]
                if len(h) != 4 or any(ch not in "0123456789abcdefABCDEF" for ch in h):
                    raise ValueError(f"bad \\u escape at {b}")
                parts.append(chr(int(h, 16)))
                i = b + 6
            else:
                parts.append(self._ESC.get(e, e))
                i = b + 2

    def number(self, i: int) -> tuple[float | int, int]:
        s, n = self.s, self.n
        j = i
        if s[j] in "+-":
            j += 1
            if s.startswith("Infinity", j):
                return (float("-inf") if s[i] == "-" else float("inf")), j + 8
        while j < n and (s[j].isdigit() or s[j] in ".eE+-"):
            if s[j] in "+-" and s[j - 1] not in "eE":
                break
            j += 1
        tok = s[i:j]
        try:
            return (int(tok) if tok.lstrip("+-").isdigit() else float(tok)), j
        except ValueError:
            raise ValueError(f"bad number {tok!r} at {i}") from None


def _not_json_object(s: str, start: int) -> bool:
    """True when ``s[start:]`` opens an object that strict JSON cannot read (next token not ``"`` or ``}``)."""
    if not s.startswith("{", start):
        return False
    j, n = start + 1, len(s)
    while j < n and s[j] in " \t\r\n":
        j += 1
    return j >= n or s[j] not in '"}'


def decode_json_at(s: str, start: int, lenient: bool = True) -> tuple[Any, int] | None:
    """Decode the JSON value starting at ``s[start]``; trailing text is left unread.

    Returns ``(value, end)`` or None. ``json`` first; the tolerant decoder when ``lenient``.
    ``json`` is skipped for an object whose first key is not double-quoted (it would only fail,
    and building its error costs more than the decoding).
    """
    if not (lenient and _not_json_object(s, start)):
        try:
            return _DECODER.raw_decode(s, start)
        except Exception:  # JSONDecodeError, RecursionError on absurd nesting
            if not lenient:
                return None
    return _lenient_at(s, start)


def _lenient_at(s: str, start: int) -> tuple[Any, int] | None:
    try:
        return _Lenient(s).value(start, 0)
    except (ValueError, RecursionError, OverflowError):
        return None


def decode_json(s: str, lenient: bool = True) -> Any:
    """The JSON value that starts at the first non-space character of ``s``; ``None`` on failure
    is ambiguous, so failures raise ValueError."""
    i = _Lenient(s).ws(0)
    r = decode_json_at(s, i, lenient)
    if r is None:
        raise ValueError("invalid JSON")
    return r[0]


# ----------------------------------------------------------------------------- call extraction


def _call_from_tags(region: str, p: int, config: ParseConfig) -> dict | ParseError:
    start = p + len(_OPEN_CALL)
    q = find_tag(region, _CLOSE_CALL, start)
    if config.multiple_calls == "reject" and find_tag(region, _OPEN_CALL, start) >= 0:
        return ParseError("multiple_calls", "more than one <tool_call> in the response")
    block = region if q < 0 else region[:q]
    brace = block.find("{", start)
    if brace < 0 or block.rfind("}") < brace:  # an object ends at a "}" (none: a cut-off reply)
        return ParseError("invalid_json", "the <tool_call> block holds no complete JSON object")
    try:  # json first: what a model writes almost always is
        obj = _DECODER.raw_decode(block, brace)[0]
    except Exception:  # JSONDecodeError, RecursionError on absurd nesting
        r = _lenient_at(block, brace) if config.lenient_json else None
        if r is None:
            return ParseError("invalid_json", "the <tool_call> block is not valid JSON")
        obj = r[0]
    if not isinstance(obj, dict):
        return ParseError("invalid_json", f"the tool call is a {type(obj).__name__}, not an object")
    return obj


def _call_from_bare(region: str, config: ParseConfig) -> dict | ParseError:
    i = region.find("{")
    last = region.rfind("}")  # an object ends at a "}": none opens after the last one (a cut-off reply)
    attempts = 0
    found: dict | None = None
    while 0 <= i < last and attempts < _MAX_BARE_ATTEMPTS:
        attempts += 1
        r = decode_json_at(region, i, config.lenient_json)
        if r is not None and isinstance(r[0], dict) and "name" in r[0] and "arguments" in r[0]:
            if found is not None:
                return ParseError("multiple_calls", "more than one JSON tool call in the response")
            found = r[0]
            if config.multiple_calls == "first":
                return found
            i = region.find("{", r[1])
            continue
        i = region.find("{", i + 1)
    if found is not None:
        return found
    return ParseError("no_call", "no <tool_call> and no JSON object with 'name' and 'arguments'")


def extract_call(text: Any, config: ParseConfig = DEFAULT_PARSE_CONFIG) -> dict | ParseError:
    """The first tool call of a response as ``{"name": str, "arguments": dict}``, platform-agnostic."""
    if not isinstance(text, str):
        return ParseError("not_text", f"response is a {type(text).__name__}, not a string")
    if len(text) > config.max_chars:
        return ParseError("too_long", f"response has {len(text)} characters > max_chars={config.max_chars}")
    region = strip_thinking(text)
    if isinstance(region, ParseError):
        return region
    p = find_tag(region, _OPEN_CALL)
    call = _call_from_tags(region, p, config) if p >= 0 else _call_from_bare(region, config)
    if isinstance(call, ParseError):
        return call
    if "name" not in call or "arguments" not in call:
        return ParseError("bad_call", "the tool call needs 'name' and 'arguments'", "name")
    args = call["arguments"]
    if isinstance(args, str):
        try:
            args = decode_json(args, config.lenient_json)
        except ValueError:
            return ParseError("invalid_json", "'arguments' is a string that is not valid JSON", "arguments")
    if not isinstance(args, dict):
        return ParseError("bad_call", f"'arguments' is a {type(args).__name__}, not an object", "arguments")
    return {"name": call["name"], "arguments": args}


def parse_action(text: Any, platform: str, config: ParseConfig = DEFAULT_PARSE_CONFIG) -> Action | ParseError:
    """Parse a model response for ``platform`` (``"desktop"`` or ``"mobile"``).

    Returns the first tool call as a validated :class:`Action`, or a :class:`ParseError` whose
    ``reason`` says why (wrong tool name for the platform, action outside the platform's set,
    missing or ill-typed argument, coordinate outside the grid, NaN/inf, unknown status or
    button, or any reason of :func:`extract_call`). Never raises for any ``text``.
    """
    if platform not in TOOL_NAMES:
        check_platform(platform)  # raises, naming it
    call = extract_call(text, config)
    if isinstance(call, ParseError):
        return call
    tool = TOOL_NAMES[platform]
    if call["name"] != tool:
        return ParseError("wrong_tool", f"name={_clip(call['name'])}; the {platform} tool is {tool!r}", "name")
    try:
        return normalize_action(platform, call["arguments"], aliases=config.action_aliases)
    except ActionError as e:
        return ParseError(e.reason, str(e), e.field)


def _clip(v: Any, n: int = 80) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 3] + "..."

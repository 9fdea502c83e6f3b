"""Normalized GUI action schema for the two platforms (desktop ``computer_use``, mobile ``mobile_use``).

One table, :data:`ACTION_SPECS`, is the single source of truth: the parser validates against it,
the scorer picks each action's comparison family from it, and :mod:`verl_mopd.rewards.prompts`
renders the tool definitions from it, so prompt, parser and scorer cannot disagree.

Public API (stable; the data pipeline and the prompt builder import it):

- ``PLATFORMS``: ``("desktop", "mobile")``; ``TOOL_NAMES[platform]``: the Qwen3-VL tool name.
- ``ACTION_SPECS[platform][action]``: :class:`ActionSpec` (arguments with kinds, required flags,
  comparison family, description).
- ``ACTION_ALIASES[platform]``, ``KEY_ALIASES``, ``BUTTON_ALIASES``, ``STATUS_ALIASES``.
- ``normalize_action(platform, arguments) -> Action``: validate and canonicalize a tool-call
  ``arguments`` dict (``{"action": NAME, ...}``); raises :class:`ActionError` naming the field,
  the value and what is allowed.
- ``normalize_key(name)``, ``platform_of_tool(name)``.
- ``to_grid(x, y, width, height)`` / ``from_grid(gx, gy, width, height)``: absolute pixels <->
  the 0-1000 relative grid of Qwen3-VL.

Sources: Qwen3-VL's ``computer_use`` / ``mobile_use`` tools (Qwen-Agent, Qwen3-VL cookbooks);
``ask_user`` from MobileWorld.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

PLATFORMS: tuple[str, ...] = ("desktop", "mobile")
TOOL_NAMES: Mapping[str, str] = MappingProxyType({"desktop": "computer_use", "mobile": "mobile_use"})
GRID_MAX = 1000  # Qwen3-VL relative grid: 0..1000 on each axis

# Comparison families: the scorer decides "fully correct" per family.
FAMILIES = ("point", "drag", "swipe", "scroll", "text", "keys", "key_text", "button", "status", "wait")

# Argument kinds the parser knows how to read.
ARG_KINDS = ("point", "text", "keys", "number", "button", "status")


class ActionError(ValueError):
    """Invalid action: ``field`` is the offending argument, ``reason`` a short machine-readable tag."""

    def __init__(self, reason: str, message: str, field: str = ""):
        super().__init__(message)
        self.reason = reason
        self.field = field


@dataclass(frozen=True)
class ArgSpec:
    """One argument of an action.

    ``kind``: ``point`` (``[x, y]`` on the 0-1000 grid), ``text`` (str), ``keys`` (list[str]),
    ``number`` (finite float), ``button`` (one of :data:`SYSTEM_BUTTONS`), ``status`` (one of
    :data:`STATUSES`).
    """

    name: str
    kind: str
    required: bool
    description: str

    def __post_init__(self):
        if self.kind not in ARG_KINDS:
            raise ValueError(f"ArgSpec {self.name!r}: kind={self.kind!r}, allowed: {ARG_KINDS}")


@dataclass(frozen=True)
class ActionSpec:
    """One action of a platform's tool: its arguments and its comparison family."""

    name: str
    family: str
    description: str
    args: tuple[ArgSpec, ...] = ()

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"ActionSpec {self.name!r}: family={self.family!r}, allowed: {FAMILIES}")

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args if a.required)

    @property
    def optional(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args if not a.required)


SYSTEM_BUTTONS: tuple[str, ...] = ("Back", "Home", "Menu", "Enter")
STATUSES: tuple[str, ...] = ("success", "failure")


def _point(required: bool, what: str = "the point to act on") -> ArgSpec:
    return ArgSpec("coordinate", "point", required, f"(x, y): {what}, on the 0-1000 relative grid.")


_TEXT = ArgSpec("text", "text", True, "The text to type.")
_TIME = ArgSpec("time", "number", False, "Seconds to wait.")
_STATUS = ArgSpec("status", "status", True, "The status of the task: 'success' or 'failure'.")
_ANSWER = ArgSpec("text", "text", True, "The answer to the user's question.")

_DESKTOP: tuple[ActionSpec, ...] = (
    ActionSpec(
        "key",
        "keys",
        "Press keys in order and release them in reverse order (e.g. ['ctrl', 'c']).",
        (ArgSpec("keys", "keys", True, "The keys to press, e.g. ['ctrl', 'c']."),),
    ),
    ActionSpec("type", "text", "Type a string of text on the keyboard.", (_TEXT,)),
    ActionSpec("mouse_move", "point", "Move the cursor to a point.", (_point(True),)),
    ActionSpec("left_click", "point", "Click the left mouse button at a point.", (_point(False),)),
    ActionSpec(
        "left_click_drag",
        "drag",
        "Drag with the left button held from the cursor (or coordinate when coordinate2 is given)"
        " to coordinate (or coordinate2).",
        (
            _point(True, "the end point, or the start point when coordinate2 is given"),
            ArgSpec("coordinate2", "point", False, "(x, y): the end point of the drag, on the 0-1000 grid."),
        ),
    ),
    ActionSpec("right_click", "point", "Click the right mouse button at a point.", (_point(False),)),
    ActionSpec("middle_click", "point", "Click the middle mouse button at a point.", (_point(False),)),
    ActionSpec("double_click", "point", "Double-click the left mouse button at a point.", (_point(False),)),
    ActionSpec("triple_click", "point", "Triple-click the left mouse button at a point.", (_point(False),)),
    ActionSpec(
        "scroll",
        "scroll",
        "Scroll the mouse wheel: positive pixels scroll up, negative scroll down.",
        (ArgSpec("pixels", "number", True, "Amount to scroll; positive = up, negative = down."), _point(False)),
    ),
    ActionSpec(
        "hscroll",
        "scroll",
        "Scroll horizontally: positive pixels scroll right, negative scroll left.",
        (ArgSpec("pixels", "number", True, "Amount to scroll; positive = right, negative = left."), _point(False)),
    ),
    ActionSpec("wait", "wait", "Wait for the screen to change.", (_TIME,)),
    ActionSpec("terminate", "status", "End the task and report its status.", (_STATUS,)),
    ActionSpec("answer", "text", "Answer the user's question.", (_ANSWER,)),
)

_MOBILE: tuple[ActionSpec, ...] = (
    ActionSpec("click", "point", "Tap a point on the screen.", (_point(True),)),
    ActionSpec(
        "long_press",
        "point",
        "Press and hold a point on the screen.",
        (_point(True), ArgSpec("time", "number", False, "Seconds to hold.")),
    ),
    ActionSpec(
        "swipe",
        "swipe",
        "Swipe from coordinate to coordinate2 (finger motion).",
        (
            _point(True, "the start point of the swipe"),
            ArgSpec("coordinate2", "point", True, "(x, y): the end point of the swipe, on the 0-1000 grid."),
        ),
    ),
    ActionSpec("type", "text", "Type text into the focused input box.", (_TEXT,)),
    ActionSpec(
        "key",
        "key_text",
        "Send a key event (adb keyevent names, e.g. 'volume_up').",
        (ArgSpec("text", "text", True, "The key name, e.g. 'volume_up'."),),
    ),
    ActionSpec(
        "system_button",
        "button",
        "Press a system button.",
        (ArgSpec("button", "button", True, "One of 'Back', 'Home', 'Menu', 'Enter'."),),
    ),
    ActionSpec(
        "open", "text", "Open an app by name.", (ArgSpec("text", "text", True, "The name of the app to open."),)
    ),
    ActionSpec("wait", "wait", "Wait for the screen to change.", (_TIME,)),
    ActionSpec("terminate", "status", "End the task and report its status.", (_STATUS,)),
    ActionSpec("answer", "text", "Answer the user's question.", (_ANSWER,)),
    ActionSpec(
        "ask_user",
        "text",
        "Ask the user for missing information (MobileWorld).",
        (ArgSpec("text", "text", True, "The question for the user."),),
    ),
)

ACTION_SPECS: Mapping[str, Mapping[str, ActionSpec]] = MappingProxyType(
    {
        "desktop": MappingProxyType({s.name: s for s in _DESKTOP}),
        "mobile": MappingProxyType({s.name: s for s in _MOBILE}),
    }
)

# Default action sets offered in the prompt (training prompts of `prepare` and the online
# adapters alike): every action of the schema. Mobile offers `ask_user` as MobileWorld's own
# prompt does (44 of its 161 GUI tasks need the user's answer) and as the UI-MOPD release's mobile
# prompt does (EliSpectre/UI-MOPD data/sft/generate_mobile_sft_parquet.py, 7fa168d). Pass
# `actions=` to system_prompt / action_sets= to prepare for a narrower set.
DEFAULT_PROMPT_ACTIONS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "desktop": tuple(s.name for s in _DESKTOP),
        "mobile": tuple(s.name for s in _MOBILE),
    }
)

ACTION_ALIASES: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {
        "desktop": MappingProxyType(
            {
                "click": "left_click",
                "tap": "left_click",
                "press": "key",
                "hotkey": "key",
                "key_press": "key",
                "type_text": "type",
                "drag": "left_click_drag",
                "move": "mouse_move",
                "hover": "mouse_move",
                "doubleclick": "double_click",
                "rightclick": "right_click",
            }
        ),
        "mobile": MappingProxyType(
            {
                "tap": "click",
                "press": "key",
                "long_click": "long_press",
                "longpress": "long_press",
                "open_app": "open",
                "launch": "open",
                "input": "type",
                "type_text": "type",
            }
        ),
    }
)

# Canonical key names (lower case, pyautogui/xdotool style; a printable character is its own
# name, "-" not "minus"). Aliases collapse to one name so that key sets compare as the keyboard
# sees them; left/right modifiers collapse to the modifier.
KEY_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "control": "ctrl",
        "ctl": "ctrl",
        "lctrl": "ctrl",
        "rctrl": "ctrl",
        "cmd": "super",
        "command": "super",
        "meta": "super",
        "win": "super",
        "windows": "super",
        "os": "super",
        "option": "alt",
        "opt": "alt",
        "return": "enter",
        "kp_enter": "enter",
        "esc": "escape",
        "del": "delete",
        "bksp": "backspace",
        "back_space": "backspace",
        "spacebar": "space",
        "pgup": "pageup",
        "page_up": "pageup",
        "prior": "pageup",
        "pgdn": "pagedown",
        "page_down": "pagedown",
        "next": "pagedown",
        "arrowup": "up",
        "arrowdown": "down",
        "arrowleft": "left",
        "arrowright": "right",
        "ins": "insert",
        "caps_lock": "capslock",
        # X11 keysym names (what xdotool and X11-trained models write) for the same keys
        "control_l": "ctrl",
        "control_r": "ctrl",
        "shift_l": "shift",
        "shift_r": "shift",
        "lshift": "shift",
        "rshift": "shift",
        "alt_l": "alt",
        "alt_r": "alt",
        "lalt": "alt",
        "ralt": "alt",
        "super_l": "super",
        "super_r": "super",
        "meta_l": "super",
        "meta_r": "super",
        "apps": "menu",
        "num_lock": "numlock",
        "scroll_lock": "scrolllock",
        "print_screen": "print",
        "printscreen": "print",
        "prtsc": "print",
        "prtscr": "print",
        "prntscrn": "print",
        "kp_return": "enter",
        # pyautogui's names of the keypad keys
        "add": "kp_add",
        "subtract": "kp_subtract",
        "multiply": "kp_multiply",
        "divide": "kp_divide",
        "decimal": "kp_decimal",
        **{f"num{d}": f"kp_{d}" for d in range(10)},
        **{name: char for char, name in zip(
            "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
            "exclam quotedbl numbersign dollar percent ampersand apostrophe parenleft parenright asterisk"
            " plus comma minus period slash colon semicolon less equal greater question at bracketleft"
            " backslash bracketright asciicircum underscore grave braceleft bar braceright asciitilde".split(),
            strict=True,
        )},
    }
)

BUTTON_ALIASES: Mapping[str, str] = MappingProxyType({b.lower(): b for b in SYSTEM_BUTTONS})
STATUS_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "success": "success",
        "succeeded": "success",
        "successful": "success",
        "failure": "failure",
        "fail": "failure",
        "failed": "failure",
    }
)

_TOOL_TO_PLATFORM = {tool: platform for platform, tool in TOOL_NAMES.items()}


def platform_of_tool(tool_name: str) -> str | None:
    """``"computer_use" -> "desktop"``, ``"mobile_use" -> "mobile"``, anything else -> None."""
    return _TOOL_TO_PLATFORM.get(tool_name)


def check_platform(platform: Any) -> str:
    if platform not in ACTION_SPECS:
        raise ActionError("unknown_platform", f"platform={platform!r}; allowed: {list(PLATFORMS)}", "platform")
    return platform


def normalize_key(name: str) -> str:
    """Canonical key name: lower case, stripped, aliases resolved (``"Control" -> "ctrl"``)."""
    k = name.strip().lower()
    if k.startswith("keycode_"):  # adb keyevent constants, e.g. KEYCODE_VOLUME_UP
        k = k[len("keycode_") :]
    return KEY_ALIASES.get(k, k)


@dataclass(frozen=True)
class Action:
    """A validated, canonical action. Unused fields are None.

    Coordinates are ``(x, y)`` floats on the 0-1000 grid; ``keys`` is a tuple of canonical key
    names (desktop ``key``; mobile ``key`` stores its single key in ``text`` as the tool does).
    """

    platform: str
    action: str
    coordinate: tuple[float, float] | None = None
    coordinate2: tuple[float, float] | None = None
    text: str | None = None
    keys: tuple[str, ...] | None = None
    pixels: float | None = None
    time: float | None = None
    button: str | None = None
    status: str | None = None
    extra: tuple[str, ...] = field(default=(), compare=False)  # names of ignored unknown arguments

    @property
    def spec(self) -> ActionSpec:
        return ACTION_SPECS[self.platform][self.action]

    @property
    def family(self) -> str:
        return ACTION_SPECS[self.platform][self.action].family

    @property
    def tool_name(self) -> str:
        return TOOL_NAMES[self.platform]

    def to_arguments(self) -> dict[str, Any]:
        """The tool-call ``arguments`` dict (Qwen3-VL format); integral numbers rendered as ints."""
        out: dict[str, Any] = {"action": self.action}
        for a in self.spec.args:
            v = getattr(self, a.name)
            if v is None:
                continue
            if a.kind == "point":
                out[a.name] = [_num_out(v[0]), _num_out(v[1])]
            elif a.kind == "keys":
                out[a.name] = list(v)
            elif a.kind == "number":
                out[a.name] = _num_out(v)
            else:
                out[a.name] = v
        return out

    def to_tool_call(self) -> dict[str, Any]:
        return {"name": self.tool_name, "arguments": self.to_arguments()}


def _num_out(v: float) -> int | float:
    return int(v) if float(v).is_integer() else v


def to_number(value: Any, field_name: str) -> float:
    """A finite float from an int, float or numeric string; bools and NaN/inf are rejected."""
    if isinstance(value, bool):
        raise ActionError("bad_type", f"{field_name}={value!r}: expected a number, got a bool", field_name)
    if isinstance(value, (int, float)):
        v = float(value)
    elif isinstance(value, str):
        try:
            v = float(value.strip())
        except ValueError:
            raise ActionError("bad_type", f"{field_name}={value!r}: expected a number", field_name) from None
    else:
        raise ActionError(
            "bad_type", f"{field_name}={value!r}: expected a number, got {type(value).__name__}", field_name
        )
    if not math.isfinite(v):
        raise ActionError("not_finite", f"{field_name}={value!r}: must be finite", field_name)
    return v


def _split_point_string(s: str) -> list[str]:
    s = s.strip()
    if len(s) > 64:
        return []
    if s[:1] in "[(" and s[-1:] in "])":
        s = s[1:-1]
    return [p for p in s.replace(",", " ").split() if p]


def to_point(value: Any, field_name: str = "coordinate") -> tuple[float, float]:
    """``[x, y]`` (ints, floats or numeric strings; or a string ``"[x, y]"``) -> a grid point.

    Raises :class:`ActionError` when the shape is wrong, a value is not finite, or the point is
    outside ``[0, 1000]`` on either axis.
    """
    if type(value) is list and len(value) == 2:  # what a model writes: two ints on the grid
        x, y = value
        if type(x) is int and type(y) is int and 0 <= x <= GRID_MAX and 0 <= y <= GRID_MAX:
            return (float(x), float(y))
    if isinstance(value, str):
        value = _split_point_string(value)
    elif not isinstance(value, (list, tuple)) and hasattr(value, "tolist"):  # numpy arrays from parquet
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ActionError("bad_type", f"{field_name}={value!r}: expected [x, y]", field_name)
    x = to_number(value[0], field_name)
    y = to_number(value[1], field_name)
    if not (0.0 <= x <= GRID_MAX and 0.0 <= y <= GRID_MAX):
        raise ActionError(
            "out_of_grid", f"{field_name}={value!r}: outside the 0-{GRID_MAX} grid", field_name
        )
    return (x, y)


def _to_text(value: Any, field_name: str) -> str:
    if not isinstance(value, str):
        raise ActionError(
            "bad_type", f"{field_name}={value!r}: expected a string, got {type(value).__name__}", field_name
        )
    return value


def _to_keys(value: Any, field_name: str) -> tuple[str, ...]:
    if isinstance(value, str):  # "ctrl+c" -> ["ctrl", "c"]; a lone "+" is the plus key
        value = [value] if value.strip() == "+" else value.split("+")
    elif not isinstance(value, (list, tuple)) and hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value:
        raise ActionError("bad_type", f"{field_name}={value!r}: expected a non-empty list of key names", field_name)
    keys = []
    for k in value:
        if not isinstance(k, str) or not k.strip():
            raise ActionError("bad_type", f"{field_name}={value!r}: every key must be a non-empty string", field_name)
        keys.append(normalize_key(k))
    return tuple(keys)


def _to_button(value: Any, field_name: str) -> str:
    b = BUTTON_ALIASES.get(value.strip().lower()) if isinstance(value, str) else None
    if b is None:
        raise ActionError(
            "bad_value", f"{field_name}={value!r}: allowed (any case): {list(SYSTEM_BUTTONS)}", field_name
        )
    return b


def _to_status(value: Any, field_name: str) -> str:
    s = STATUS_ALIASES.get(value.strip().lower()) if isinstance(value, str) else None
    if s is None:
        raise ActionError("bad_value", f"{field_name}={value!r}: allowed: {list(STATUSES)}", field_name)
    return s


_READERS = {
    "point": to_point,
    "text": _to_text,
    "keys": _to_keys,
    "number": to_number,
    "button": _to_button,
    "status": _to_status,
}


def resolve_action_name(platform: str, name: Any, aliases: bool = True) -> str:
    """Canonical action name for ``platform``; raises :class:`ActionError` if it is not in the set."""
    specs = ACTION_SPECS[check_platform(platform)]
    if isinstance(name, str):
        if name in specs:
            return name
        n = name.strip().lower()
        if n in specs:
            return n
        if aliases and n in ACTION_ALIASES[platform]:
            return ACTION_ALIASES[platform][n]
    raise ActionError(
        "unknown_action", f"action={name!r} is not a {platform} action; allowed: {list(specs)}", "action"
    )


def normalize_action(platform: str, arguments: Mapping[str, Any], aliases: bool = True) -> Action:
    """Validate a tool-call ``arguments`` dict and return its canonical :class:`Action`.

    Args:
        platform: ``"desktop"`` or ``"mobile"``.
        arguments: ``{"action": NAME, ...args}`` as in Qwen3-VL tool calls. Coordinates may be
            ints, floats or numeric strings on the 0-1000 grid; unknown arguments are ignored
            (their names are kept in ``Action.extra``); ``None`` counts as absent.
        aliases: resolve action-name aliases (``tap`` -> ``click``); key, button and status
            aliases are always resolved.

    Raises:
        ActionError: unknown platform or action, missing or ill-typed required argument,
            coordinates outside the grid, non-finite numbers, unknown status or button.
    """
    if type(arguments) is not dict and not isinstance(arguments, Mapping):
        raise ActionError("bad_type", f"arguments={_short(arguments)}: expected an object", "arguments")
    if "action" not in arguments:
        raise ActionError("missing_action", f"arguments={_short(arguments)}: no 'action' field", "action")
    name = arguments["action"]
    plans = _PLANS.get(platform) if isinstance(platform, str) else None
    entry = plans.get(name) if plans is not None and isinstance(name, str) else None
    if entry is None:  # not a canonical name (or not a platform): aliases, case, or the error
        name = resolve_action_name(platform, name, aliases)
        entry = _PLANS[platform][name]
    plan, known = entry
    values: dict[str, Any] = {}
    get = arguments.get
    for arg_name, reader, required in plan:
        v = get(arg_name)
        if v is None:
            if required:
                raise ActionError("missing_arg", f"{name}: required argument {arg_name!r} is missing", arg_name)
            continue
        values[arg_name] = reader(v, arg_name)
    extra = tuple(k for k in arguments if k not in known) if len(arguments) > len(values) + 1 else ()
    return _new_action(platform, name, values, extra)


def _new_action(platform: str, name: str, values: dict[str, Any], extra: tuple[str, ...]) -> Action:
    """``Action(platform, name, extra=extra, **values)``, built without the frozen ``__init__``.

    That ``__init__`` sets each of the 11 fields through ``object.__setattr__`` (about 1 us, a
    sixth of a reward call); this fills the instance dict with the fields given and leaves the
    others to the class defaults, which is the same object (equality, hash, repr, pickling).
    """
    action = object.__new__(Action)
    d = action.__dict__
    d.update(values)
    d["platform"] = platform
    d["action"] = name
    if extra:
        d["extra"] = extra
    return action


# Per action: ((argument, reader, required), ...) and the set of known argument names.
_PLANS = {
    platform: {
        name: (tuple((a.name, _READERS[a.kind], a.required) for a in spec.args), {"action", *(a.name for a in spec.args)})
        for name, spec in specs.items()
    }
    for platform, specs in ACTION_SPECS.items()
}


def _short(obj: Any, n: int = 120) -> str:
    r = repr(obj)
    return r if len(r) <= n else r[: n - 3] + "..."


def to_grid(x: float, y: float, width: float, height: float, *, integer: bool = True) -> tuple[float, float]:
    """Absolute pixels on a ``width x height`` screen -> the 0-1000 relative grid.

    ``gx = x / width * 1000`` (the divisor Qwen3-VL's cookbooks use; some use 999, a 0.1%
    difference). Rounded to ints when ``integer``. Raises ValueError for a non-positive screen
    size or a point outside the screen.
    """
    if not (width > 0 and height > 0 and math.isfinite(width) and math.isfinite(height)):
        raise ValueError(f"screen size width={width!r}, height={height!r}: both must be finite and > 0")
    if not (0 <= x <= width and 0 <= y <= height):
        raise ValueError(f"point ({x!r}, {y!r}) is outside the screen {width}x{height}")
    gx, gy = x / width * GRID_MAX, y / height * GRID_MAX
    if integer:
        return (round(gx), round(gy))
    return (gx, gy)


def from_grid(gx: float, gy: float, width: float, height: float) -> tuple[float, float]:
    """The 0-1000 grid -> absolute pixels on a ``width x height`` screen (inverse of :func:`to_grid`)."""
    if not (width > 0 and height > 0):
        raise ValueError(f"screen size width={width!r}, height={height!r}: both must be > 0")
    if not (0 <= gx <= GRID_MAX and 0 <= gy <= GRID_MAX):
        raise ValueError(f"grid point ({gx!r}, {gy!r}) is outside 0-{GRID_MAX}")
    return (gx / GRID_MAX * width, gy / GRID_MAX * height)

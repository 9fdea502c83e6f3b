"""Readers from public trajectory formats into the Uni-GUI schema (:mod:`verl_mopd.data.schema`).

A reader never drops a step: an action it cannot map keeps a descriptive name (e.g.
``"pyautogui.mouseDown"``) so that the ``action_space`` cleaning rule counts and reports it. A
record it cannot read at all (wrong types, missing fields, not JSON) raises
:class:`~verl_mopd.data.schema.SchemaError` naming ``file:line``, or, given a ``drops``
list, becomes a ``parse`` drop there and reading goes on. Screenshot paths are resolved and
confined to the reader's image folder plus ``roots`` (:class:`~verl_mopd.data.images.DataRoots`).

**OpenCUA AgentNet (desktop)** -- ``xlangai/AgentNet``: ``agentnet_ubuntu_5k.jsonl`` with its
screenshots in ``ubuntu_images/`` and ``agentnet_win_mac_18k.jsonl`` with ``win_mac_images/``
(each the folder the split zip is extracted into). One task a line, as in OpenCUA's
``data/cot-generate`` example: ``{"task_id", "instruction", "natural_language_task"?,
"actual_task"?, "task_completed": true | false | null, "alignment_score"?, "efficiency_score"?,
"task_difficulty"?, "domain"?, "reason"?, "traj": [{"index", "image": "<uuid>.png", "value":
{"observation", "thought", "action", "code", "reflection", "last_step_correct",
"last_step_redundant"}}]}``. ``code`` is PyAutoGUI with coordinates as 0-1 fractions of the
screen, written by OpenCUA's ``PyAutoGUIAction.to_command`` (keyword arguments:
``pyautogui.hotkey(keys=['ctrl', 'c'])``, ``pyautogui.press(keys=['enter'])``), several calls
in one step where one action was recorded as several (``write`` then ``press``; ``moveTo`` then
``dragTo`` / ``scroll``), plus ``computer.tripleClick``, ``computer.wait``,
``computer.terminate``. Parsed with :mod:`ast`, never executed. Mapping:

==================================================  ============================================
code                                                action (unit coordinates)
==================================================  ============================================
``click`` (``button``, ``clicks``), ``rightClick``,  ``left_click`` / ``right_click`` /
``middleClick``, ``doubleClick``, ``tripleClick``,  ``middle_click`` / ``double_click`` /
``computer.tripleClick``                            ``triple_click``
``moveTo``; ``moveTo`` + ``dragTo``                 ``mouse_move``; ``left_click_drag`` (2 points)
``scroll(n)`` / ``hscroll(n)`` (+ a ``moveTo``)     ``scroll`` / ``hscroll``, ``pixels`` = n wheel
                                                    clicks (the reward compares the sign)
``write`` / ``typewrite``                           ``type``
``write(t)`` + ``press('enter')`` (or ``tab``)      ``type`` of ``t + "\\n"`` (``"\\t"``): what
                                                    ``pyautogui.write`` does with those
                                                    characters, and AgentNetBench's own merge
``press(k)``, ``press(keys=[k])``, ``hotkey(...)``  ``key`` (a chord)
(positional, list, or ``keys=``)
``computer.wait`` / ``time.sleep``                  ``wait``
``computer.terminate(status=)``                     ``terminate``
==================================================  ============================================

Not mappable to one student action, so kept under a descriptive name for the ``action_space``
rule: ``press`` with ``presses`` > 1 or with several keys (a sequence of presses, not a chord),
a right/middle-button ``dragTo``, ``mouseDown``/``mouseUp``, any other call pair, code that does
not parse or whose arguments are not literals.

``task_completed`` is OpenCUA's whole-task verdict: ``true``/``false`` become the trajectory's
offline judge verdict (one subtask, the instruction; model ``agentnet:task_completed``), which
the ``subtasks`` rule reads, so ``false`` is dropped; ``null`` is no verdict (``missing_verdict``).
``thought`` -> ``thought``, ``value.action`` -> ``description``; ``task_completed``, the scores,
``task_difficulty`` and ``domain`` go to ``meta``. A ``task_id`` seen before is a ``parse`` drop
(:func:`~verl_mopd.data.schema.drop_duplicate_ids`).

**AndroidControl (mobile)** -- the records of google-research ``android_control`` (README, "Dataset
format"): ``episode_id``, ``goal``, ``screenshots`` (PNG bytes; here also file paths),
``screenshot_widths``, ``screenshot_heights``, ``actions`` (JSON strings, one fewer than
screenshots), ``step_instructions``. Action types: ``click``/``long_press`` (``x``, ``y`` in
pixels), ``scroll`` (``direction``), ``open_app`` (``app_name``), ``type`` (click + text +
enter: kept as ``type`` of ``text``, the click and the enter are not representable in one step),
``input_text`` (``text``), ``navigate_home``, ``navigate_back``, ``wait``. ``scroll`` becomes a
``swipe`` through the screen centre over half the screen; AndroidControl's ``direction`` names
where the content moves into view (``down``: see what is below), so the finger moves the
opposite way unless ``scroll_is_finger=True``. ``step_instructions`` -> ``description``. The
final screenshot becomes a ``terminate`` step (``append_terminate``).
"""

from __future__ import annotations

import ast
import json
import os
from dataclasses import replace
from typing import Any, Iterable, Iterator, Mapping, Sequence

from verl_mopd.data.images import DataRoots
from verl_mopd.data.schema import Drop, SchemaError, Step, Trajectory, iter_jsonl, parse_drop
from verl_mopd.files import atomic_write

# ----------------------------------------------------------------------------- AgentNet / PyAutoGUI

_CLICKS = {
    "pyautogui.click": "left_click",
    "pyautogui.leftClick": "left_click",
    "pyautogui.rightClick": "right_click",
    "pyautogui.middleClick": "middle_click",
    "pyautogui.doubleClick": "double_click",
    "pyautogui.tripleClick": "triple_click",
    "computer.tripleClick": "triple_click",
    "computer.triple_click": "triple_click",
}
_BUTTON_CLICK = {"left": "left_click", "right": "right_click", "middle": "middle_click"}
_MULTI_CLICK = {2: "double_click", 3: "triple_click"}
_TYPED_KEYS = {"enter": "\n", "return": "\n", "tab": "\t"}  # keys pyautogui.write types as characters
MAX_CODE_CHARS = 10_000  # longer "code" is not one recorded action


def _call_name(node: ast.expr) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _literal_call(call: ast.Call) -> tuple[list[Any], dict[str, Any]]:
    args = [ast.literal_eval(a) for a in call.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg is not None}
    return args, kwargs


def _xy(args: list[Any], kwargs: dict[str, Any]) -> list[float] | None:
    x = kwargs.get("x", args[0] if len(args) > 0 else None)
    y = kwargs.get("y", args[1] if len(args) > 1 else None)
    if isinstance(x, (list, tuple)) and len(x) == 2 and y is None:  # click((x, y))
        x, y = x
    if x is None or y is None:
        return None
    return [x, y]


def _key_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _press(args: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], Any]:
    """``pyautogui.press(keys, presses=1, ...)`` -> (keys, presses)."""
    keys = _key_list(kwargs.get("keys", args[0] if args else None))
    return keys, kwargs.get("presses", args[1] if len(args) > 1 else 1)


def _single(name: str, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    if name in _CLICKS:
        action = _CLICKS[name]
        if name == "pyautogui.click":
            action = _BUTTON_CLICK.get(str(kwargs.get("button", "left")), action)
            clicks = kwargs.get("clicks", 1)
            action = _MULTI_CLICK.get(clicks, action) if isinstance(clicks, int) else action
        out: dict[str, Any] = {"action": action}
        xy = _xy(args, kwargs)
        if xy is not None:
            out["coordinate"] = xy
        return out
    if name == "pyautogui.moveTo":
        return {"action": "mouse_move", "coordinate": _xy(args, kwargs)}
    if name == "pyautogui.dragTo":
        if kwargs.get("button", "left") != "left":
            return {"action": f"pyautogui.dragTo(button={kwargs['button']!r})"}
        return {"action": "left_click_drag", "coordinate": _xy(args, kwargs)}
    if name in ("pyautogui.scroll", "pyautogui.hscroll"):
        amount = kwargs.get("clicks", args[0] if args else None)
        out = {"action": name.split(".")[1], "pixels": amount}
        xy = _xy(args[1:], kwargs)
        if xy is not None:
            out["coordinate"] = xy
        return out
    if name in ("pyautogui.write", "pyautogui.typewrite"):
        text = kwargs.get("message", args[0] if args else None)
        if isinstance(text, list):  # typewrite(['a', 'enter']) presses each in turn
            typed = [k if isinstance(k, str) and len(k) == 1 else _TYPED_KEYS.get(k) for k in text]
            if len(text) == 1 and typed[0] is None:
                return {"action": "key", "keys": text}
            if any(c is None for c in typed):
                return {"action": f"{name}(a key sequence)"}
            return {"action": "type", "text": "".join(typed)}
        return {"action": "type", "text": text}
    if name == "pyautogui.press":
        keys, presses = _press(args, kwargs)
        if presses != 1:
            return {"action": f"pyautogui.press(presses={presses!r})"}
        if len(keys) != 1:
            return {"action": f"pyautogui.press({len(keys)} keys in sequence)"}
        return {"action": "key", "keys": keys}
    if name == "pyautogui.hotkey":
        if "keys" in kwargs:
            keys = _key_list(kwargs["keys"])
        else:
            keys = list(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else list(args)
        return {"action": "key", "keys": keys}
    if name == "computer.terminate":
        return {"action": "terminate", "status": kwargs.get("status", args[0] if args else None)}
    if name in ("computer.wait", "time.sleep", "pyautogui.sleep"):
        t = kwargs.get("seconds", args[0] if args else None)
        return {"action": "wait", **({"time": t} if t is not None else {})}
    return {"action": name}


def _pair(first: tuple, second: tuple) -> dict[str, Any] | None:
    """Two calls recorded as one action, or None."""
    (n1, a1, k1), (n2, a2, k2) = first, second
    if n1 == "pyautogui.moveTo":
        start = _xy(a1, k1)
        nxt = _single(n2, a2, k2)
        if nxt["action"] == "left_click_drag" and start is not None:
            return {"action": "left_click_drag", "coordinate": start, "coordinate2": nxt["coordinate"]}
        if nxt["action"] in ("scroll", "hscroll") and "coordinate" not in nxt and start is not None:
            return {**nxt, "coordinate": start}
    if n1 in ("pyautogui.write", "pyautogui.typewrite") and n2 == "pyautogui.press":
        typed = _single(n1, a1, k1)
        keys, presses = _press(a2, k2)
        if typed["action"] == "type" and isinstance(typed["text"], str) and isinstance(presses, int) and presses >= 1:
            if len(keys) == 1 and isinstance(keys[0], str) and keys[0].lower() in _TYPED_KEYS:
                return {"action": "type", "text": typed["text"] + _TYPED_KEYS[keys[0].lower()] * presses}
    return None


def pyautogui_to_action(code: str) -> dict[str, Any]:
    """One step's PyAutoGUI code -> a ``computer_use`` arguments dict in unit (0-1) coordinates.

    Never raises: unmappable code keeps a descriptive action name (``"pyautogui.mouseDown"``,
    ``"<syntax error>"``, ``"<2 calls: ...>"``, ``"<non-literal arguments>"``) that the
    ``action_space`` rule rejects and reports.
    """
    if not isinstance(code, str) or len(code) > MAX_CODE_CHARS:
        return {"action": "<code too long>" if isinstance(code, str) else "<no code>", "code": str(code)[:200]}
    try:
        tree = ast.parse(code.strip())
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: NUL bytes
        return {"action": "<syntax error>", "code": code}
    calls = [n.value for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)]
    if len(calls) != len(tree.body) or not calls:
        return {"action": "<not a call>", "code": code}
    try:
        parsed = [(_call_name(c.func), *_literal_call(c)) for c in calls]
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return {"action": "<non-literal arguments>", "code": code}
    try:
        if len(parsed) == 1:
            return _single(*parsed[0])
        if len(parsed) == 2:
            merged = _pair(parsed[0], parsed[1])
            if merged is not None:
                return merged
    except (TypeError, ValueError, AttributeError):  # literal arguments of unexpected types
        return {"action": f"<bad arguments to {parsed[0][0]}>", "code": code}
    return {"action": f"<{len(parsed)} calls: {' + '.join(p[0] for p in parsed)}>", "code": code}


def _record_head(record: Any, id_key: str, image_dir: str | DataRoots, where: str) -> tuple[DataRoots, Any, str]:
    """A record's image roots, id and place for messages; raises SchemaError for a non-object or a bad id."""
    if not isinstance(record, Mapping):
        raise SchemaError(f"{where}={str(record)[:80]!r}: expected a JSON object", "not_object")
    rid = record.get(id_key)
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise SchemaError(f"{where}.{id_key}={str(rid)[:80]!r}: expected a string or an integer")
    roots = image_dir if isinstance(image_dir, DataRoots) else DataRoots.of(image_dir)
    return roots, rid, f"{where}[{id_key}={rid!r}]"


def _field(d: Mapping, key: str, types: type, where: str, optional: bool = False) -> Any:
    v = d.get(key)
    if v is None and optional:
        return None
    if not isinstance(v, types):
        expected = "an object" if types is Mapping else types.__name__
        raise SchemaError(f"{where}.{key}={str(v)[:80]!r}: expected {expected}")
    return v


def agentnet_to_trajectory(
    record: Any, image_dir: str | DataRoots, instruction_key: str = "instruction", where: str = "agentnet"
) -> Trajectory:
    """One AgentNet record -> :class:`Trajectory` (desktop, unit coordinates); raises SchemaError."""
    roots, tid, where = _record_head(record, "task_id", image_dir, where)
    traj = _field(record, "traj", list, where)
    instruction = record.get(instruction_key) or record.get("instruction")
    if not isinstance(instruction, str):
        raise SchemaError(f"{where}.{instruction_key}={str(instruction)[:80]!r}: expected a string")
    completed = record.get("task_completed")
    if completed is not None and not isinstance(completed, bool):
        raise SchemaError(f"{where}.task_completed={completed!r}: expected true, false or null")
    steps = []
    for i, st in enumerate(traj):
        w = f"{where}.traj[{i}]"
        if not isinstance(st, Mapping):
            raise SchemaError(f"{w}={str(st)[:80]!r}: expected an object")
        value = _field(st, "value", Mapping, w)
        code = _field(value, "code", str, f"{w}.value")
        index = st.get("index", i)
        if isinstance(index, bool) or not isinstance(index, int):
            raise SchemaError(f"{w}.index={index!r}: expected an integer")
        image = _field(st, "image", str, w)
        thought = _field(value, "thought", str, f"{w}.value", optional=True)
        described = _field(value, "action", str, f"{w}.value", optional=True)
        path, problem = roots.resolve(image)
        steps.append(Step(index, path, pyautogui_to_action(code), thought or "", described or "", path_error=problem))
    meta = {k: record[k] for k in ("task_completed", "alignment_score", "efficiency_score", "task_difficulty", "domain")
            if k in record}  # fmt: skip
    judge = None
    if completed is not None:
        judge = {"subtasks": [{"subtask": instruction, "completed": completed}], "model": "agentnet:task_completed"}
    return Trajectory(
        id=str(tid),
        platform="desktop",
        instruction=instruction,
        steps=tuple(steps),
        coords="unit",
        judge=judge,
        source="agentnet",
        meta=meta,
    )


def agentnet_image_dir(path: str) -> str:
    """Where the released dataset keeps a JSONL's screenshots, beside it: ``ubuntu_images/`` for
    ``agentnet_ubuntu_*.jsonl``, ``win_mac_images/`` for ``agentnet_win_mac_*.jsonl``, else
    ``images/``."""
    folder = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path).lower()
    for part, sub in (("ubuntu", "ubuntu_images"), ("win_mac", "win_mac_images")):
        if part in name:
            return os.path.join(folder, sub)
    return os.path.join(folder, "images")


def _read_records(path: str, to_trajectory, drops: list[Drop] | None, **drop_keys: Any) -> Iterator[Trajectory]:
    for where, record in iter_jsonl(path):
        try:
            if isinstance(record, SchemaError):
                raise record
            t = to_trajectory(record, where)
        except SchemaError as e:
            if drops is None:
                raise
            drops.append(parse_drop(where, e, None if isinstance(record, SchemaError) else record, **drop_keys))
            continue
        yield replace(t, origin=where)


def read_agentnet(
    path: str,
    image_dir: str | None = None,
    instruction_key: str = "instruction",
    drops: list[Drop] | None = None,
    roots: Sequence[str] = (),
) -> Iterator[Trajectory]:
    """AgentNet JSONL -> trajectories; images under ``image_dir`` (default :func:`agentnet_image_dir`)
    or ``roots``. A bad record raises SchemaError, or with ``drops`` becomes a ``parse`` drop."""
    data_roots = DataRoots.of(image_dir or agentnet_image_dir(path), roots)
    yield from _read_records(
        path, lambda r, w: agentnet_to_trajectory(r, data_roots, instruction_key, w), drops,
        id_key="task_id", steps_key="traj", platform="desktop",
    )  # fmt: skip


# ----------------------------------------------------------------------------- AndroidControl

_BUTTONS = {"navigate_back": "Back", "navigate_home": "Home"}
_CONTENT_TO_FINGER = {"up": "down", "down": "up", "left": "right", "right": "left"}
_FINGER = {"up": ((0.5, 0.75), (0.5, 0.25)), "down": ((0.5, 0.25), (0.5, 0.75)),
           "left": ((0.75, 0.5), (0.25, 0.5)), "right": ((0.25, 0.5), (0.75, 0.5))}  # fmt: skip


def android_control_action(a: Mapping[str, Any], width: int, height: int, scroll_is_finger: bool = False) -> dict[str, Any]:
    """One AndroidControl action dict -> a ``mobile_use`` arguments dict in pixels."""
    kind = a.get("action_type")
    if not isinstance(kind, str):
        return {"action": f"<action_type {str(kind)[:40]}>"}
    if kind in ("click", "long_press"):
        return {"action": kind, "coordinate": [a.get("x"), a.get("y")]}
    if kind == "scroll":
        d = str(a.get("direction", "")).lower()
        finger = d if scroll_is_finger else _CONTENT_TO_FINGER.get(d)
        if finger not in _FINGER:
            return {"action": f"scroll:{d[:40]}"}
        (sx, sy), (ex, ey) = _FINGER[finger]
        return {
            "action": "swipe",
            "coordinate": [round(sx * width), round(sy * height)],
            "coordinate2": [round(ex * width), round(ey * height)],
        }
    if kind in ("input_text", "type"):
        return {"action": "type", "text": a.get("text")}
    if kind == "open_app":
        return {"action": "open", "text": a.get("app_name")}
    if kind in _BUTTONS:
        return {"action": "system_button", "button": _BUTTONS[kind]}
    if kind == "wait":
        return {"action": "wait"}
    return {"action": kind}


def _pixels(v: Any, where: str) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise SchemaError(f"{where}={str(v)[:40]!r}: expected a positive integer (pixels)")
    return v


def _write_png(path: str, data: bytes) -> None:
    """Atomically (no torn file is left for a later run to trust)."""
    with atomic_write(path, "wb") as f:
        f.write(data)


def android_control_to_trajectory(
    record: Any,
    image_dir: str | DataRoots,
    scroll_is_finger: bool = False,
    append_terminate: bool = True,
    where: str = "android_control",
) -> Trajectory:
    """One AndroidControl episode -> :class:`Trajectory` (mobile, pixel coordinates per step).

    Screenshots given as bytes are written to ``image_dir/<episode_id>_<i>.png`` (kept if present);
    given as paths, they are relative to ``image_dir`` and confined to it (and its roots).
    """
    roots, eid, where = _record_head(record, "episode_id", image_dir, where)
    shots, widths, heights = (record.get(k) for k in ("screenshots", "screenshot_widths", "screenshot_heights"))
    actions = record.get("actions")
    if not all(isinstance(v, (list, tuple)) for v in (shots, widths, heights, actions)):
        raise SchemaError(f"{where}: needs lists 'screenshots', 'screenshot_widths', 'screenshot_heights', 'actions'")
    if not len(shots) == len(widths) == len(heights) or len(actions) not in (len(shots) - 1, len(shots)):
        raise SchemaError(
            f"{where}: {len(shots)} screenshots, {len(widths)} widths, {len(heights)} heights, {len(actions)} actions;"
            " expected equal screenshot/size counts and one action fewer than screenshots"
        )
    goal = record.get("goal")
    if not isinstance(goal, str):
        raise SchemaError(f"{where}.goal={str(goal)[:80]!r}: expected a string")
    instructions = record.get("step_instructions") or []
    if not isinstance(instructions, list) or not all(isinstance(s, str) for s in instructions):
        raise SchemaError(f"{where}.step_instructions: expected a list of strings")
    sizes = [(_pixels(w, f"{where}.screenshot_widths[{i}]"), _pixels(h, f"{where}.screenshot_heights[{i}]"))
             for i, (w, h) in enumerate(zip(widths, heights, strict=True))]  # fmt: skip
    paths: list[tuple[str, str | None]] = []
    for i, shot in enumerate(shots):
        if isinstance(shot, (bytes, bytearray)):
            os.makedirs(roots.base, exist_ok=True)
            p = os.path.join(roots.base, f"{eid}_{i}.png")
            if not os.path.exists(p):
                _write_png(p, bytes(shot))
            paths.append(roots.resolve(p))
        elif isinstance(shot, str):
            paths.append(roots.resolve(shot))
        else:
            raise SchemaError(f"{where}.screenshots[{i}]: expected PNG bytes or a path, got {type(shot).__name__}")
    steps = []
    for i, raw in enumerate(actions):
        try:
            a = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
        except (ValueError, RecursionError) as e:
            raise SchemaError(f"{where}.actions[{i}]={str(raw)[:80]!r}: not JSON ({e})") from None
        if not isinstance(a, Mapping):
            raise SchemaError(f"{where}.actions[{i}]={str(raw)[:80]!r}: expected a JSON object")
        steps.append(
            Step(
                index=i,
                screenshot=paths[i][0],
                action=android_control_action(a, *sizes[i], scroll_is_finger=scroll_is_finger),
                description=instructions[i] if i < len(instructions) else "",
                screen_size=sizes[i],
                path_error=paths[i][1],
            )
        )
    if append_terminate and len(shots) == len(actions) + 1:
        i = len(actions)
        steps.append(
            Step(
                index=i,
                screenshot=paths[i][0],
                action={"action": "terminate", "status": "success"},
                description="The task is complete.",
                screen_size=sizes[i],
                path_error=paths[i][1],
            )
        )
    return Trajectory(
        id=f"android_control-{eid}",
        platform="mobile",
        instruction=goal,
        steps=tuple(steps),
        coords="pixel",
        source="android_control",
    )


def read_android_control_jsonl(
    path: str, image_dir: str | None = None, drops: list[Drop] | None = None, roots: Sequence[str] = (), **kwargs: Any
) -> Iterator[Trajectory]:
    """AndroidControl episodes exported as JSONL (screenshots as paths relative to ``image_dir``,
    default the JSONL's folder)."""
    data_roots = DataRoots.of(image_dir or os.path.dirname(os.path.abspath(path)), roots)
    yield from _read_records(
        path, lambda r, w: android_control_to_trajectory(r, data_roots, where=w, **kwargs), drops,
        id_key="episode_id", steps_key="screenshots", platform="mobile", id_prefix="android_control-",
    )  # fmt: skip


def iter_android_control_tfrecords(pattern: str) -> Iterator[dict[str, Any]]:
    """The official GZIP TFRecords -> record dicts (needs ``tensorflow``, not a dependency)."""
    try:
        import tensorflow as tf
    except ImportError:
        raise ImportError(
            "reading AndroidControl TFRecords needs tensorflow (pip install tensorflow-cpu), "
            "or export the episodes to JSONL with screenshots as files"
        ) from None
    spec = {
        "episode_id": tf.io.FixedLenFeature([], tf.int64),
        "goal": tf.io.FixedLenFeature([], tf.string),
        "screenshots": tf.io.VarLenFeature(tf.string),
        "screenshot_widths": tf.io.VarLenFeature(tf.int64),
        "screenshot_heights": tf.io.VarLenFeature(tf.int64),
        "actions": tf.io.VarLenFeature(tf.string),
        "step_instructions": tf.io.VarLenFeature(tf.string),
    }
    for raw in tf.data.TFRecordDataset(tf.io.gfile.glob(pattern), compression_type="GZIP"):
        ex = tf.io.parse_single_example(raw, spec)
        dense = {k: tf.sparse.to_dense(v).numpy().tolist() for k, v in ex.items() if isinstance(v, tf.sparse.SparseTensor)}
        yield {
            "episode_id": int(ex["episode_id"].numpy()),
            "goal": ex["goal"].numpy().decode("utf-8"),
            "screenshots": dense["screenshots"],
            "screenshot_widths": dense["screenshot_widths"],
            "screenshot_heights": dense["screenshot_heights"],
            "actions": [b.decode("utf-8") for b in dense["actions"]],
            "step_instructions": [b.decode("utf-8") for b in dense["step_instructions"]],
        }


def read_android_control(
    path: str, image_dir: str | None = None, drops: list[Drop] | None = None, roots: Sequence[str] = (), **kwargs: Any
) -> Iterable[Trajectory]:
    """``*.jsonl`` -> :func:`read_android_control_jsonl`; anything else is a TFRecord glob."""
    if path.endswith(".jsonl"):
        return read_android_control_jsonl(path, image_dir, drops, roots, **kwargs)
    default = os.path.join(os.path.dirname(os.path.abspath(path)), "android_control_images")
    data_roots = DataRoots.of(image_dir or default, roots)
    return _tfrecord_trajectories(path, data_roots, drops, **kwargs)


def _tfrecord_trajectories(pattern: str, roots: DataRoots, drops: list[Drop] | None, **kwargs: Any) -> Iterator[Trajectory]:
    for n, record in enumerate(iter_android_control_tfrecords(pattern), 1):
        where = f"{pattern}#{n}"
        try:
            yield replace(android_control_to_trajectory(record, roots, where=where, **kwargs), origin=where)
        except SchemaError as e:
            if drops is None:
                raise
            drops.append(parse_drop(where, e, record, id_key="episode_id", steps_key="screenshots", platform="mobile",
                                    id_prefix="android_control-"))  # fmt: skip


__all__ = [
    "agentnet_image_dir",
    "agentnet_to_trajectory",
    "android_control_action",
    "android_control_to_trajectory",
    "iter_android_control_tfrecords",
    "pyautogui_to_action",
    "read_agentnet",
    "read_android_control",
    "read_android_control_jsonl",
]

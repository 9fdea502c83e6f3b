"""Readers from public trajectory formats into the Uni-GUI schema (:mod:`verl_mopd.data.trajectories`).

A reader never drops a step: an action it cannot map keeps its source name (e.g.
``"pyautogui.mouseDown"``) so that the ``action_space`` cleaning rule counts and reports it.

**OpenCUA AgentNet (desktop)** — ``xlangai/AgentNet`` JSONL, as documented in the OpenCUA repo
(``data/README.md``, ``data/cot-generate``): one task a line,
``{"task_id", "instruction", "natural_language_task"?, "actual_task"?, "task_completed"?,
"traj": [{"index", "image": "<file>.png", "value": {"observation", "thought", "action",
"code", "reflection", "last_step_correct", "last_step_redundant"}}]}``. ``code`` is PyAutoGUI
with coordinates as 0-1 fractions of the screen (``pyautogui.click(x=0.018, y=0.508)``), plus
``computer.terminate(status=...)`` / ``computer.wait()``. Mapped (parsed with :mod:`ast`, never
executed): ``click`` (``button``/``clicks`` respected), ``rightClick``, ``middleClick``,
``doubleClick``, ``tripleClick``, ``moveTo``, ``dragTo`` (after a ``moveTo``: a two-point drag),
``scroll`` / ``hscroll`` (after a ``moveTo``, or with ``x``/``y``: at that point), ``write`` /
``typewrite``, ``press``, ``hotkey``, ``computer.terminate``, ``computer.wait`` /
``time.sleep``. ``thought`` -> ``thought``, ``action`` -> ``description``.

**AndroidControl (mobile)** — the records of google-research ``android_control`` (README, "Dataset
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
from typing import Any, Iterable, Iterator, Mapping

from verl_mopd.data.trajectories import SchemaError, Step, Trajectory

# ----------------------------------------------------------------------------- AgentNet / PyAutoGUI

_CLICKS = {
    "pyautogui.click": "left_click",
    "pyautogui.leftClick": "left_click",
    "pyautogui.rightClick": "right_click",
    "pyautogui.middleClick": "middle_click",
    "pyautogui.doubleClick": "double_click",
    "pyautogui.tripleClick": "triple_click",
    "computer.triple_click": "triple_click",
}
_BUTTON_CLICK = {"left": "left_click", "right": "right_click", "middle": "middle_click"}
_MULTI_CLICK = {2: "double_click", 3: "triple_click"}


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


def _single(name: str, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    if name in _CLICKS:
        action = _CLICKS[name]
        if name == "pyautogui.click":
            action = _BUTTON_CLICK.get(str(kwargs.get("button", "left")), action)
            action = _MULTI_CLICK.get(kwargs.get("clicks", 1), action)
        out: dict[str, Any] = {"action": action}
        xy = _xy(args, kwargs)
        if xy is not None:
            out["coordinate"] = xy
        return out
    if name == "pyautogui.moveTo":
        return {"action": "mouse_move", "coordinate": _xy(args, kwargs)}
    if name == "pyautogui.dragTo":
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
        if isinstance(text, list):  # typewrite(['a', 'b', 'enter']) presses keys
            return {"action": "key", "keys": text}
        return {"action": "type", "text": text}
    if name == "pyautogui.press":
        keys = kwargs.get("keys", args[0] if args else None)
        return {"action": "key", "keys": keys if isinstance(keys, list) else [keys]}
    if name == "pyautogui.hotkey":
        keys = args[0] if len(args) == 1 and isinstance(args[0], list) else list(args)
        return {"action": "key", "keys": keys}
    if name == "computer.terminate":
        return {"action": "terminate", "status": kwargs.get("status", args[0] if args else None)}
    if name in ("computer.wait", "time.sleep", "pyautogui.sleep"):
        t = kwargs.get("seconds", args[0] if args else None)
        return {"action": "wait", **({"time": t} if t is not None else {})}
    return {"action": name}


def pyautogui_to_action(code: str) -> dict[str, Any]:
    """One step's PyAutoGUI code -> a ``computer_use`` arguments dict in unit (0-1) coordinates.

    Unmappable code keeps a descriptive action name (``"pyautogui.mouseDown"``, ``"<syntax error>"``,
    ``"<2 calls: ...>"``) that the ``action_space`` rule rejects and reports.
    """
    try:
        tree = ast.parse(code.strip())
    except SyntaxError:
        return {"action": "<syntax error>", "code": code}
    calls = [n.value for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)]
    if len(calls) != len(tree.body) or not calls:
        return {"action": "<not a call>", "code": code}
    try:
        parsed = [(_call_name(c.func), *_literal_call(c)) for c in calls]
    except (ValueError, SyntaxError):
        return {"action": "<non-literal arguments>", "code": code}
    if len(parsed) == 1:
        return _single(*parsed[0])
    if len(parsed) == 2 and parsed[0][0] == "pyautogui.moveTo":
        start = _xy(parsed[0][1], parsed[0][2])
        second = _single(*parsed[1])
        if second["action"] == "left_click_drag" and start is not None:
            return {"action": "left_click_drag", "coordinate": start, "coordinate2": second["coordinate"]}
        if second["action"] in ("scroll", "hscroll") and "coordinate" not in second and start is not None:
            return {**second, "coordinate": start}
    return {"action": f"<{len(parsed)} calls: {' + '.join(p[0] for p in parsed)}>", "code": code}


def agentnet_to_trajectory(record: Mapping[str, Any], image_dir: str, instruction_key: str = "instruction") -> Trajectory:
    """One AgentNet record -> :class:`Trajectory` (desktop, unit coordinates)."""
    where = f"agentnet[task_id={record.get('task_id')!r}]"
    if not isinstance(record.get("traj"), list):
        raise SchemaError(f"{where}.traj={str(record.get('traj'))[:80]!r}: expected a list of steps")
    instruction = record.get(instruction_key) or record.get("instruction")
    if not isinstance(instruction, str):
        raise SchemaError(f"{where}.{instruction_key}={instruction!r}: expected a string")
    steps = []
    for i, st in enumerate(record["traj"]):
        value = st.get("value") or {}
        code = value.get("code")
        if not isinstance(code, str):
            raise SchemaError(f"{where}.traj[{i}].value.code={code!r}: expected PyAutoGUI code")
        index = st.get("index", i)
        if isinstance(index, bool) or not isinstance(index, int):
            raise SchemaError(f"{where}.traj[{i}].index={index!r}: expected an integer")
        image = st.get("image")
        if not isinstance(image, str):
            raise SchemaError(f"{where}.traj[{i}].image={image!r}: expected a file name")
        steps.append(
            Step(
                index=index,
                screenshot=image if os.path.isabs(image) else os.path.join(image_dir, image),
                action=pyautogui_to_action(code),
                thought=value.get("thought") or "",
                description=value.get("action") or "",
            )
        )
    meta = {k: record[k] for k in ("task_completed", "alignment_score", "efficiency_score", "domain") if k in record}
    return Trajectory(
        id=str(record.get("task_id")),
        platform="desktop",
        instruction=instruction,
        steps=tuple(steps),
        coords="unit",
        source="agentnet",
        meta=meta,
    )


def _jsonl_records(path: str) -> Iterator[dict]:
    """The JSON objects of a JSONL file, one a non-empty line; a bad line names file and line."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except ValueError as e:
                    raise SchemaError(f"{path}:{lineno}: not JSON ({e})") from None


def read_agentnet(path: str, image_dir: str | None = None, instruction_key: str = "instruction") -> Iterator[Trajectory]:
    """AgentNet JSONL -> trajectories; images under ``image_dir`` (default: ``<jsonl dir>/images``)."""
    image_dir = image_dir or os.path.join(os.path.dirname(os.path.abspath(path)), "images")
    for record in _jsonl_records(path):
        yield agentnet_to_trajectory(record, image_dir, instruction_key)


# ----------------------------------------------------------------------------- AndroidControl

_BUTTONS = {"navigate_back": "Back", "navigate_home": "Home"}
_CONTENT_TO_FINGER = {"up": "down", "down": "up", "left": "right", "right": "left"}
_FINGER = {"up": ((0.5, 0.75), (0.5, 0.25)), "down": ((0.5, 0.25), (0.5, 0.75)),
           "left": ((0.75, 0.5), (0.25, 0.5)), "right": ((0.25, 0.5), (0.75, 0.5))}  # fmt: skip


def android_control_action(a: Mapping[str, Any], width: int, height: int, scroll_is_finger: bool = False) -> dict[str, Any]:
    """One AndroidControl action dict -> a ``mobile_use`` arguments dict in pixels."""
    kind = a.get("action_type")
    if kind in ("click", "long_press"):
        return {"action": kind, "coordinate": [a.get("x"), a.get("y")]}
    if kind == "scroll":
        d = str(a.get("direction", "")).lower()
        finger = d if scroll_is_finger else _CONTENT_TO_FINGER.get(d)
        if finger not in _FINGER:
            return {"action": f"scroll:{d}"}
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
    return {"action": str(kind)}


def android_control_to_trajectory(
    record: Mapping[str, Any],
    image_dir: str,
    scroll_is_finger: bool = False,
    append_terminate: bool = True,
) -> Trajectory:
    """One AndroidControl episode -> :class:`Trajectory` (mobile, pixel coordinates per step).

    Screenshots given as bytes are written to ``image_dir/<episode_id>_<i>.png`` (kept if present).
    """
    eid = record.get("episode_id")
    where = f"android_control[episode_id={eid!r}]"
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
        raise SchemaError(f"{where}.goal={goal!r}: expected a string")
    instructions = list(record.get("step_instructions") or [])
    paths = []
    for i, shot in enumerate(shots):
        if isinstance(shot, (bytes, bytearray)):
            os.makedirs(image_dir, exist_ok=True)
            p = os.path.join(image_dir, f"{eid}_{i}.png")
            if not os.path.exists(p):
                with open(p, "wb") as f:
                    f.write(shot)
            paths.append(p)
        elif isinstance(shot, str):
            paths.append(shot if os.path.isabs(shot) else os.path.join(image_dir, shot))
        else:
            raise SchemaError(f"{where}.screenshots[{i}]: expected PNG bytes or a path, got {type(shot).__name__}")
    steps = []
    for i, raw in enumerate(actions):
        a = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
        if not isinstance(a, Mapping):
            raise SchemaError(f"{where}.actions[{i}]={raw!r}: expected a JSON object")
        size = (int(widths[i]), int(heights[i]))
        steps.append(
            Step(
                index=i,
                screenshot=paths[i],
                action=android_control_action(a, *size, scroll_is_finger=scroll_is_finger),
                description=instructions[i] if i < len(instructions) else "",
                screen_size=size,
            )
        )
    if append_terminate and len(shots) == len(actions) + 1:
        i = len(actions)
        steps.append(
            Step(
                index=i,
                screenshot=paths[i],
                action={"action": "terminate", "status": "success"},
                description="The task is complete.",
                screen_size=(int(widths[i]), int(heights[i])),
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


def read_android_control_jsonl(path: str, image_dir: str | None = None, **kwargs: Any) -> Iterator[Trajectory]:
    """AndroidControl episodes exported as JSONL (screenshots as paths relative to ``image_dir``,
    default the JSONL's folder)."""
    image_dir = image_dir or os.path.dirname(os.path.abspath(path))
    for record in _jsonl_records(path):
        yield android_control_to_trajectory(record, image_dir, **kwargs)


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


def read_android_control(path: str, image_dir: str | None = None, **kwargs: Any) -> Iterable[Trajectory]:
    """``*.jsonl`` -> :func:`read_android_control_jsonl`; anything else is a TFRecord glob."""
    if path.endswith(".jsonl"):
        return read_android_control_jsonl(path, image_dir, **kwargs)
    image_dir = image_dir or os.path.join(os.path.dirname(os.path.abspath(path)) or ".", "android_control_images")
    return (android_control_to_trajectory(r, image_dir, **kwargs) for r in iter_android_control_tfrecords(path))


__all__ = [
    "agentnet_to_trajectory",
    "android_control_action",
    "android_control_to_trajectory",
    "iter_android_control_tfrecords",
    "pyautogui_to_action",
    "read_agentnet",
    "read_android_control",
    "read_android_control_jsonl",
]

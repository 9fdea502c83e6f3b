"""OSWorld agent: screenshot -> our ``computer_use`` prompt -> model -> pyautogui code for the harness.

Written against OSWorld's agent interface (xlang-ai/OSWorld ``lib_run_single.run_single_example``;
read in the fork karakuri-ai/OSWorld-JP, ``lib_run_single.py`` at d936d4e): the harness calls
``agent.reset(runtime_logger)`` (``agent.reset()`` if that raises), then, while ``step_idx <
max_steps``, ``response, actions = agent.predict(instruction, obs)`` with ``obs["screenshot"]`` the
PNG bytes of the screen, and ``env.step(action)`` for each string in ``actions``. A string is
pyautogui code that the VM runs as ``python -c "import pyautogui; import time; pyautogui.FAILSAFE =
False; {command}"`` (``desktop_env/controllers/python.py``) after ``DesktopEnv.step`` has rewritten
``typewrite``/``press`` calls with ``<`` (``_fix_pyautogui_less_than_bug``), or one of ``"WAIT"``,
``"DONE"``, ``"FAIL"``. ``DONE`` and ``FAIL`` end the episode; ``DesktopEnv.evaluate`` scores an
infeasible task 1 exactly when the last action is ``FAIL``, and any other task 0 when it is. Run it
with the ``pyautogui`` action space and the ``screenshot`` observation type, e.g. through
:func:`main` (``python -m verl_mopd.eval.osworld`` from an OSWorld checkout; docs/evaluation.md).

Translation (:func:`to_pyautogui`; points from the 0-1000 grid to screen pixels of the
screenshot with :func:`~verl_mopd.eval.agent.grid_to_pixel`):

================  ======================================================================
left_click etc.   ``pyautogui.click(x, y)``, ``rightClick``, ``middleClick``, ``doubleClick``,
                  ``tripleClick``; without a coordinate, at the cursor (``pyautogui.click()``)
mouse_move        ``pyautogui.moveTo(x, y)``
left_click_drag   ``pyautogui.dragTo(x, y, duration=0.5, button='left')`` from the cursor;
                  with ``coordinate2``: ``pyautogui.moveTo(x1, y1); pyautogui.dragTo(x2, y2, ...)``
scroll / hscroll  ``pyautogui.scroll(pixels)`` / ``pyautogui.hscroll(pixels)`` (+ ``x=, y=`` when
                  a coordinate is given); positive = up / right, as in Qwen3-VL and pyautogui
key               one key ``pyautogui.press('k')``, several ``pyautogui.hotkey('ctrl', 'c')``; our
                  canonical names in pyautogui's spelling (:data:`PYAUTOGUI_KEY_NAMES`), ``<`` as
                  ``shift`` + ``,``; a key without a keycode on the VM's X11 display is refused
type              ``pyautogui.write('...')`` per line, ``pyautogui.press('enter')`` between lines,
                  ``<`` as ``pyautogui.hotkey('shift', ',')``; a line with characters that have no
                  key on a US keyboard is pasted: ``pyperclip.copy('...'); pyautogui.hotkey('ctrl',
                  'v')`` (see below)
wait              ``WAIT``
terminate         ``DONE`` (success) / ``FAIL`` (failure: the model's claim that the task is
                  infeasible, which is what OSWorld's ``FAIL`` means)
answer            ``DONE`` (OSWorld has no answer channel; the text stays in the response)
================  ======================================================================

Why ``type`` is split: pyautogui 0.9.54 on X11 types ``<`` as ``>`` (it presses shift with the
keycode of the keysym ``less``, which is the extra pc105 key whose shifted symbol is ``>``;
asweigart/pyautogui #198), and OSWorld's own rewrite only matches ``typewrite``/``press``; the
segments written here contain no ``<``, so every known variant of that rewrite leaves them as they
are. pyautogui silently skips a character without a keycode (any non-ASCII character on the US
layout), so such lines go through the clipboard as OSWorld's other agents do (``mm_agents/dart_gui``
pastes with xclip, OSWorld-JP's ``DesktopEnv`` rewrites non-ASCII ``write`` to the same
``pyperclip.copy`` + ctrl+v). pyperclip is installed wherever pyautogui is (through MouseInfo);
it needs ``xclip`` or ``xsel`` in the VM, and ctrl+v pastes in GUI apps but not in a terminal.

Key names: an xdotool/X11 name (``minus``, ``Control_L``, ``KP_Add``, ``Menu``) is the same key as
its canonical name (:func:`verl_mopd.rewards.actions.normalize_key`); a key that has no keycode
on OSWorld's US keyboard (``volumeup``, ``f13``, ``é``) would be skipped by pyautogui without a
trace, so the step is refused instead (:class:`~verl_mopd.eval.agent.Unsupported`) and handled
like an unparseable reply.

The step budget (``max_steps``, 30 by default as in the paper) is enforced here too: past it the
agent answers no action (``[]``), which is what the harness's own stop amounts to (its checker runs
on the state reached; an infeasible task scores 0), never ``FAIL``. Run the harness with
``--max_steps 30`` so it does not stop earlier (its default is 15). An unparseable reply gives no
action by default (``on_invalid="skip"``), as OSWorld's own Qwen3-VL agent does; ``"retry"`` asks
once more within the step, ``"wait"`` answers ``WAIT``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import string
from typing import Any, Callable, Sequence

from verl_mopd.eval.agent import (
    DEFAULT_MAX_STEPS,
    DEFAULT_USER_TEMPLATE,
    StepPrompter,
    Unsupported,
    ask,
    grid_to_pixel,
    screenshot_size,
    to_png,
)
from verl_mopd.rewards import Action

SPECIAL = ("WAIT", "DONE", "FAIL")
_CLICKS = {
    "left_click": "click",
    "right_click": "rightClick",
    "middle_click": "middleClick",
    "double_click": "doubleClick",
    "triple_click": "tripleClick",
}
# our canonical key names (verl_mopd.rewards.actions.normalize_key) that pyautogui spells differently
PYAUTOGUI_KEY_NAMES = {
    "super": "win",
    "menu": "apps",
    "kp_add": "add",
    "kp_subtract": "subtract",
    "kp_multiply": "multiply",
    "kp_divide": "divide",
    "kp_decimal": "decimal",
    **{f"kp_{d}": f"num{d}" for d in range(10)},
}
# keys pyautogui gets wrong or lacks, pressed as a chord (OSWorld's own replacement for "<")
KEY_CHORDS = {"<": ("shift", ","), "iso_left_tab": ("shift", "tab")}
# pyautogui 0.9.54 names that have a keycode on OSWorld's Ubuntu display (X11 evdev, pc105, us):
# the non-None entries of pyautogui/_pyautogui_x11.py::keyboardMapping there, printable ASCII aside.
# tests/eval/test_harness_osworld_on_cpu.py recomputes this set from pyautogui's own source.
PYAUTOGUI_X11_KEYS = frozenset(
    "add alt altleft altright apps backspace capslock ctrl ctrlleft ctrlright decimal del delete divide"
    " down end enter esc escape f1 f2 f3 f4 f5 f6 f7 f8 f9 f10 f11 f12 help home insert left multiply"
    " num0 num1 num2 num3 num4 num5 num6 num7 num8 num9 numlock pagedown pageup pause pgdn pgup print"
    " printscreen prntscrn prtsc prtscr return right scrolllock shift shiftleft shiftright space subtract"
    " tab up win winleft winright".split()
) | frozenset(string.digits + string.ascii_letters + string.punctuation + " \t\n\r\b")
_TYPABLE = frozenset(string.printable) - {"\x0b", "\x0c"}  # what pyautogui.write types on a US keyboard
DRAG_DURATION = 0.5
ON_INVALID = ("skip", "retry", "wait")


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _key_command(keys: Sequence[str]) -> str:
    names: list[str] = []
    for k in keys:
        for name in KEY_CHORDS.get(k, (PYAUTOGUI_KEY_NAMES.get(k, k),)):
            if name not in PYAUTOGUI_X11_KEYS:
                raise Unsupported(f"key {k!r} has no keycode on OSWorld's X11 keyboard (pyautogui would skip it)")
            if name not in names:
                names.append(name)
    args = ", ".join(repr(n) for n in names)
    return f"pyautogui.press({args})" if len(names) == 1 else f"pyautogui.hotkey({args})"


def _type_command(text: str) -> str:
    """pyautogui code that types ``text`` exactly (see the module docstring)."""
    parts: list[str] = []
    paste = False
    for i, line in enumerate(text.split("\n")):
        if i:
            parts.append("pyautogui.press('enter')")
        if not line:
            continue
        if _TYPABLE.issuperset(line):
            for j, seg in enumerate(line.split("<")):
                if j:
                    parts.append("pyautogui.hotkey('shift', ',')")
                if seg:
                    parts.append(f"pyautogui.write({seg!r})")
        else:
            paste = True
            parts.append(f"pyperclip.copy({line!r}); pyautogui.hotkey('ctrl', 'v')")
    if not parts:
        return "pyautogui.write('')"
    return ("import pyperclip; " if paste else "") + "; ".join(parts)


def to_pyautogui(action: Action, width: int, height: int) -> list[str]:
    """One desktop :class:`Action` -> the OSWorld actions that perform it (see the module table).

    Raises :class:`~verl_mopd.eval.agent.Unsupported` for a key OSWorld's display does not have.
    """
    if action.platform != "desktop":
        raise ValueError(f"action.platform={action.platform!r}: OSWorld takes desktop (computer_use) actions")
    name = action.action

    def px(point: tuple[float, float]) -> str:
        x, y = grid_to_pixel(point[0], point[1], width, height)
        return f"{x}, {y}"

    if name in _CLICKS:
        fn = _CLICKS[name]
        return [f"pyautogui.{fn}({px(action.coordinate)})" if action.coordinate is not None else f"pyautogui.{fn}()"]
    if name == "mouse_move":
        return [f"pyautogui.moveTo({px(action.coordinate)})"]
    if name == "left_click_drag":
        drag = f"duration={DRAG_DURATION}, button='left'"
        if action.coordinate2 is None:
            return [f"pyautogui.dragTo({px(action.coordinate)}, {drag})"]
        return [f"pyautogui.moveTo({px(action.coordinate)}); pyautogui.dragTo({px(action.coordinate2)}, {drag})"]
    if name in ("scroll", "hscroll"):
        at = ""
        if action.coordinate is not None:
            x, y = grid_to_pixel(action.coordinate[0], action.coordinate[1], width, height)
            at = f", x={x}, y={y}"
        return [f"pyautogui.{name}({_num(round(action.pixels))}{at})"]
    if name == "key":
        return [_key_command(action.keys)]
    if name == "type":
        return [_type_command(action.text)]
    if name == "wait":
        return ["WAIT"]
    if name == "terminate":
        return ["DONE" if action.status == "success" else "FAIL"]
    if name == "answer":
        return ["DONE"]
    raise ValueError(f"action={name!r}: no OSWorld translation")  # unreachable for a valid Action


class OSWorldAgent:
    """An OSWorld agent around any client (``complete(messages) -> str``).

    Args:
        complete: e.g. ``OpenAIClient(base_url, model).complete``.
        max_steps: the step budget (30): harness steps, i.e. ``predict`` calls; a ``"retry"`` ask
            within a step does not count.
        user_template, history_n, actions: the step prompt
            (:class:`~verl_mopd.eval.agent.StepPrompter`).
        on_invalid: an unparseable reply or a key OSWorld cannot press: ``"skip"`` (no action,
            default), ``"retry"`` (ask once more, then skip) or ``"wait"``. Never ``FAIL``: that
            would claim the task infeasible.
    """

    def __init__(
        self,
        complete: Callable[[list[dict[str, Any]]], str],
        *,
        max_steps: int = DEFAULT_MAX_STEPS,
        user_template: str = DEFAULT_USER_TEMPLATE,
        history_n: int | None = None,
        actions: Sequence[str] | None = None,
        on_invalid: str = "skip",
    ):
        if on_invalid not in ON_INVALID:
            raise ValueError(f"on_invalid={on_invalid!r}: allowed {list(ON_INVALID)}")
        if not (isinstance(max_steps, int) and max_steps >= 1):
            raise ValueError(f"max_steps={max_steps!r}: must be an int >= 1")
        self.complete = complete
        self.max_steps = max_steps
        self.on_invalid = on_invalid
        self.prompter = StepPrompter("desktop", user_template, history_n, actions)
        self.steps = 0
        self.logger = logging.getLogger("verl_mopd.eval.osworld")

    def reset(self, _logger: logging.Logger | None = None, *args: Any, **kwargs: Any) -> None:
        """Called by the harness before each task (it may pass its runtime logger)."""
        if _logger is not None:
            self.logger = _logger
        self.prompter.reset()
        self.steps = 0

    def predict(self, instruction: str, obs: dict[str, Any]) -> tuple[str, list[str]]:
        """``obs["screenshot"]``: PNG bytes -> ``(response, actions)`` for ``env.step``."""
        if self.steps >= self.max_steps:
            return f"step budget of {self.max_steps} spent: no action", []
        self.steps += 1
        screenshot = obs["screenshot"]
        width, height = screenshot_size(screenshot)
        attempts = 2 if self.on_invalid == "retry" else 1
        out = ask(self.complete, self.prompter, instruction, to_png(screenshot),
                  lambda a: to_pyautogui(a, width, height), attempts)
        if out.output is None:
            self.logger.info("step %d: %s", self.steps, out.reason)
            return out.response or "", ["WAIT"] if self.on_invalid == "wait" else []
        self.logger.info("step %d: %s", self.steps, out.output)
        return out.response, out.output


def main(argv: Sequence[str] | None = None) -> list[float]:
    """Run OSWorld's test set with :class:`OSWorldAgent` on an OpenAI-compatible server.

    Run from the root of an OSWorld checkout (its ``lib_run_single`` and ``desktop_env`` are
    imported from the working directory); results go where OSWorld's own ``run.py`` puts them,
    ``{result_dir}/pyautogui/screenshot/{model}/{domain}/{example_id}/result.txt``, and finished
    examples are skipped, so a run can be resumed.
    """
    p = argparse.ArgumentParser("python -m verl_mopd.eval.osworld", description=main.__doc__.split("\n")[0])
    p.add_argument("--base-url", required=True, help="OpenAI-compatible server, e.g. http://127.0.0.1:30000/v1")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS, help="the step budget (30 as in the paper)")
    p.add_argument("--history-n", type=int, default=None, help="previous actions shown (default: all, as prepare)")
    p.add_argument("--on-invalid", choices=ON_INVALID, default="skip")
    p.add_argument("--provider-name", default="docker", help="OSWorld provider: docker, vmware, aws, ...")
    p.add_argument("--path-to-vm", default=None)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--screen-width", type=int, default=1920)
    p.add_argument("--screen-height", type=int, default=1080)
    p.add_argument("--sleep-after-execution", type=float, default=0.0)
    p.add_argument("--client-password", default="")
    p.add_argument("--test-config-base-dir", default="evaluation_examples")
    p.add_argument("--test-all-meta-path", default="evaluation_examples/test_all.json")
    p.add_argument("--domain", default="all", help="one domain of the meta file, or all")
    p.add_argument("--result-dir", default="./results")
    args = p.parse_args(argv)

    import lib_run_single  # OSWorld's, from the working directory
    from desktop_env.desktop_env import DesktopEnv

    from verl_mopd.clients import OpenAIClient

    client = OpenAIClient(args.base_url, args.model, api_key=args.api_key, max_tokens=args.max_tokens)
    agent = OSWorldAgent(client.complete, max_steps=args.max_steps, history_n=args.history_n, on_invalid=args.on_invalid)
    with open(args.test_all_meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    if args.domain != "all":
        meta = {args.domain: meta[args.domain]}
    env = DesktopEnv(
        provider_name=args.provider_name,
        path_to_vm=args.path_to_vm,
        action_space="pyautogui",
        screen_size=(args.screen_width, args.screen_height),
        headless=args.headless,
        os_type="Ubuntu",
        require_a11y_tree=False,
        client_password=args.client_password,
    )
    scores: list[float] = []
    try:
        for domain, example_ids in meta.items():
            for example_id in example_ids:
                out_dir = os.path.join(args.result_dir, "pyautogui", "screenshot", args.model, domain, example_id)
                if os.path.exists(os.path.join(out_dir, "result.txt")):
                    continue
                os.makedirs(out_dir, exist_ok=True)
                with open(os.path.join(args.test_config_base_dir, "examples", domain, f"{example_id}.json"), encoding="utf-8") as f:
                    example = json.load(f)
                try:
                    lib_run_single.run_single_example(
                        agent, env, example, args.max_steps, example["instruction"], args, out_dir, scores
                    )
                except Exception as e:  # one broken example must not end the run; OSWorld's run.py does the same
                    logging.getLogger("verl_mopd.eval.osworld").exception("example %s/%s failed", domain, example_id)
                    with open(os.path.join(out_dir, "traj.jsonl"), "a", encoding="utf-8") as f:
                        f.write(json.dumps({"Error": f"{type(e).__name__}: {e}"}) + "\n")
    finally:
        env.close()
    if scores:
        print(f"OSWorld: {len(scores)} examples run, success rate {sum(scores) / len(scores):.4f}")
    return scores


if __name__ == "__main__":
    main()

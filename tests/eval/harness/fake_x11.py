"""The installed pyautogui 0.9.54 (OSWorld's VM pins it) driving a recorded X11 display with OSWorld's keyboard.

Everything between a pyautogui call and the X server is the real code: ``pyautogui/__init__.py``,
``pyautogui/_pyautogui_x11.py`` (its ``keyboardMapping``, ``_keyDown``'s shift handling, its
silent skip of keys without a keycode) and python-xlib's own ``Display._update_keymap`` /
``keysym_to_keycode`` / ``Xlib.XK``. Only the connection is replaced: :class:`RecordedDisplay` serves
the keyboard mapping of ``x11_keymap_us_pc105.txt`` (``xmodmap -pke`` of an X server with the
evdev/pc105/us keyboard of OSWorld's Ubuntu VM) and ``fake_input`` records the XTEST events instead
of sending them. :class:`FocusedApp` turns those events into what a focused text field receives
(typed text, chords, ctrl+v pastes the clipboard) and what the pointer does.

:func:`load_pyautogui` needs pyautogui from the ``test`` extra; :func:`run_vm_command` runs one
OSWorld action string as the VM server does (``PythonController.pkgs_prefix``).
"""

from __future__ import annotations

import os
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

KEYMAP = Path(__file__).with_name("x11_keymap_us_pc105.txt")
# desktop_env/controllers/python.py::PythonController.pkgs_prefix (xlang-ai/OSWorld; read in Untergang1/OSWorld 68cec8e)
PKGS_PREFIX = "import pyautogui; import time; pyautogui.FAILSAFE = False; {command}"
MODIFIERS = {"Shift_L": "shift", "Shift_R": "shift", "Control_L": "ctrl", "Control_R": "ctrl", "Alt_L": "alt",
             "Alt_R": "alt", "Super_L": "super", "Super_R": "super"}


def _keymap_names() -> dict[int, list[str]]:
    rows = {}
    for line in KEYMAP.read_text().splitlines():
        if line.startswith("keycode"):
            head, _, syms = line.partition("=")
            rows[int(head.split()[1])] = syms.split()
    return rows


class RecordedDisplay:
    """An X display with OSWorld's keymap whose input requests are recorded, not sent."""

    def __init__(self, width: int = 1920, height: int = 1080):
        import Xlib.display
        import Xlib.XK

        self.names = _keymap_names()
        self._rows = {code: [Xlib.XK.string_to_keysym(n) if n != "NoSymbol" else 0 for n in row]
                      for code, row in self.names.items()}
        self._keymap_codes, self._keymap_syms = [()] * 256, {}
        # python-xlib's own keymap bookkeeping and lookups, on this display's mapping
        type(self)._update_keymap = Xlib.display.Display._update_keymap
        type(self).keysym_to_keycode = Xlib.display.Display.keysym_to_keycode
        type(self).keycode_to_keysym = Xlib.display.Display.keycode_to_keysym
        self._update_keymap(8, 248)
        self.events: list[tuple] = []
        self.pointer = [0, 0]
        self.width, self.height = width, height

    def get_keyboard_mapping(self, first: int, count: int) -> list[list[int]]:
        return [self._rows.get(code, []) for code in range(first, first + count)]

    def screen(self):
        d = self
        root = types.SimpleNamespace(query_pointer=lambda: types.SimpleNamespace(
            _data={"root_x": d.pointer[0], "root_y": d.pointer[1]}))
        return types.SimpleNamespace(root=root, width_in_pixels=d.width, height_in_pixels=d.height)

    def symbol(self, keycode: int, shifted: bool) -> str:
        """The keysym name a key produces, by the core protocol's rule: a missing shifted symbol is
        the unshifted one (one-level keys such as the keypad's parenleft)."""
        row = self.names.get(keycode, [])
        unshifted = row[0] if row and row[0] != "NoSymbol" else ""
        if shifted and len(row) > 1 and row[1] != "NoSymbol":
            return row[1]
        return unshifted

    def sync(self) -> None:
        pass

    def record(self, event_type: int, detail: int = 0, x: int = 0, y: int = 0, **_) -> None:
        from Xlib import X

        if event_type == X.MotionNotify:
            self.pointer = [x, y]
        self.events.append((event_type, detail, *self.pointer))


@dataclass
class FocusedApp:
    """What a focused GUI text field and the pointer receive from the recorded events."""

    text: str = ""
    chords: list[tuple[str, ...]] = field(default_factory=list)
    buttons: list[tuple[str, int, int, int]] = field(default_factory=list)  # ("down"/"up"/"wheel", button, x, y)
    clipboard: str = ""

    def feed(self, display: RecordedDisplay) -> None:
        from Xlib import X, XK

        held: list[str] = []
        alone = False  # a modifier pressed with no other key yet (super alone opens GNOME's overview)
        for event_type, detail, x, y in display.events:
            if event_type == "clipboard":
                self.clipboard = detail
            elif event_type in (X.ButtonPress, X.ButtonRelease):
                if detail in (4, 5, 6, 7):
                    if event_type == X.ButtonPress:
                        self.buttons.append(("wheel", detail, x, y))
                else:
                    self.buttons.append(("down" if event_type == X.ButtonPress else "up", detail, x, y))
            elif event_type in (X.KeyPress, X.KeyRelease):
                base = display.symbol(detail, False)
                if base in MODIFIERS:
                    mod = MODIFIERS[base]
                    if event_type == X.KeyPress:
                        held.append(mod)
                        alone = True
                    else:
                        if alone and mod != "shift":
                            self.chords.append(tuple(sorted(set(held))))
                        alone = False
                        if mod in held:
                            held.remove(mod)
                    continue
                if event_type == X.KeyRelease:
                    continue
                alone = False
                sym = display.symbol(detail, "shift" in held)
                keysym = XK.string_to_keysym(sym)
                char = {"Return": "\n", "KP_Enter": "\n", "Tab": "\t"}.get(sym)
                if char is None and 0x20 <= keysym <= 0x7E:
                    char = chr(keysym)
                if char is None or any(m != "shift" for m in held):
                    chord = (*sorted(set(held)), base.lower() if len(base) > 1 else base)
                    self.chords.append(chord)
                    if chord == ("ctrl", "v"):
                        self.text += self.clipboard
                else:
                    self.text += char


class Clipboard:
    """The VM's clipboard (xclip) as pyperclip sees it; a copy is an event in the display's stream."""

    def __init__(self, app: FocusedApp, display: RecordedDisplay):
        self.app, self.display, self.text = app, display, app.clipboard

    def copy(self, text: str) -> None:
        self.text = str(text)
        self.display.events.append(("clipboard", self.text, 0, 0))

    def paste(self) -> str:
        return self.text


_LOADED: dict[str, types.ModuleType] = {}


def load_pyautogui(width: int = 1920, height: int = 1080):
    """The installed pyautogui imported against a :class:`RecordedDisplay`; returns (pyautogui, display).

    Imported once per process (pyautogui keeps module state); :func:`new_display` starts a new screen.
    """
    if "pyautogui" not in _LOADED:
        import Xlib.display
        import Xlib.ext.xtest

        display = RecordedDisplay(width, height)
        saved = (Xlib.display.Display, Xlib.ext.xtest.fake_input, os.environ.get("DISPLAY"))
        before = {name: sys.modules.get(name) for name in ("pyautogui", "pyautogui._pyautogui_x11", "mouseinfo")}
        Xlib.display.Display = lambda *a, **k: display
        Xlib.ext.xtest.fake_input = lambda d, event_type, detail=0, **kw: display.record(event_type, detail, **kw)
        os.environ["DISPLAY"] = ":0"
        try:
            import pyautogui
        finally:
            Xlib.display.Display, Xlib.ext.xtest.fake_input = saved[0], saved[1]
            if saved[2] is None:
                os.environ.pop("DISPLAY", None)
            else:
                os.environ["DISPLAY"] = saved[2]
        x11 = sys.modules["pyautogui._pyautogui_x11"]
        x11._mouse_is_swapped_setting = False  # skip the dconf subprocess
        pyautogui.PAUSE = 0
        # pyautogui's own sleeps (tweened drags, pauses) cost wall time only
        pyautogui.time = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")})
        pyautogui.time.sleep = lambda s: None
        _LOADED.update(pyautogui=pyautogui, x11=x11)
        for name, mod in before.items():  # leave the process's own imports as they were
            if mod is not None:
                sys.modules[name] = mod
        new_display(width, height)
    return _LOADED["pyautogui"], _LOADED["display"]


def new_display(width: int = 1920, height: int = 1080) -> RecordedDisplay:
    """A fresh screen (pointer at 0, 0) for the loaded pyautogui: one per episode."""
    display = RecordedDisplay(width, height)
    x11 = _LOADED["x11"]
    x11._display = display
    x11.fake_input = lambda d, event_type, detail=0, **kw: display.record(event_type, detail, **kw)
    _LOADED["display"] = display
    return display


def run_vm_command(command: str, app: FocusedApp | None = None) -> FocusedApp:
    """Run one OSWorld action string on the VM (``python -c PKGS_PREFIX``) and feed the app."""
    import pyperclip

    pyautogui, display = load_pyautogui()
    app = app or FocusedApp()
    clip = Clipboard(app, display)
    saved = sys.modules.get("pyautogui"), pyperclip.copy, pyperclip.paste
    sys.modules["pyautogui"] = pyautogui
    pyperclip.copy, pyperclip.paste = clip.copy, clip.paste  # the VM's clipboard (xclip) is this app's
    try:
        exec(compile(PKGS_PREFIX.format(command=command), "<osworld-vm>", "exec"), {"__name__": "__main__"})
    finally:
        pyperclip.copy, pyperclip.paste = saved[1], saved[2]
        if saved[0] is None:
            sys.modules.pop("pyautogui", None)
        else:
            sys.modules["pyautogui"] = saved[0]
    app.feed(display)
    display.events.clear()
    return app

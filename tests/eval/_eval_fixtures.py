"""Recorded step samples, screenshots and model responses for the eval tests (made here, no downloads)."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from verl_mopd.rewards import system_prompt


def png(width: int, height: int, color=(40, 120, 200)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, format="PNG")
    return buf.getvalue()


def call(tool: str, **arguments) -> str:
    return "I see the screen.</think>\n<tool_call>\n" + json.dumps({"name": tool, "arguments": arguments}) + "\n</tool_call>"


def truth(platform: str, action: dict, bbox=None) -> str:
    gt = {"platform": platform, "action": action}
    if bbox is not None:
        gt["bbox"] = bbox
    return json.dumps(gt)


# (id, platform, ground-truth action, bbox, recorded response, expected: score, parsed, action_match, grounding)
CASES = [
    ("d0", "desktop", {"action": "left_click", "coordinate": [500, 300]}, [450, 250, 550, 350],
     call("computer_use", action="left_click", coordinate=[510, 310]), 1.0, 1, 1, 1.0),
    ("d1", "desktop", {"action": "left_click", "coordinate": [500, 300]}, [450, 250, 550, 350],
     call("computer_use", action="left_click", coordinate=[900, 900]), -0.5, 1, 1, 0.0),
    # wrong action type but the point is on the target: partial, yet grounded
    ("d2", "desktop", {"action": "double_click", "coordinate": [200, 800]}, [150, 750, 250, 850],
     call("computer_use", action="left_click", coordinate=[200, 800]), -0.5, 1, 0, 1.0),
    ("d3", "desktop", {"action": "type", "text": "hello world"}, None,
     call("computer_use", action="type", text="Hello  world"), 1.0, 1, 1, None),
    ("d4", "desktop", {"action": "key", "keys": ["ctrl", "s"]}, None, "no tool call here", -1.0, 0, 0, None),
    ("m0", "mobile", {"action": "click", "coordinate": [100, 900]}, [50, 850, 150, 950],
     call("mobile_use", action="click", coordinate=[110, 905]), 1.0, 1, 1, 1.0),
    # the desktop tool on a mobile step: unparseable for the platform
    ("m1", "mobile", {"action": "click", "coordinate": [100, 900]}, [50, 850, 150, 950],
     call("computer_use", action="left_click", coordinate=[110, 905]), -1.0, 0, 0, 0.0),
    ("m2", "mobile", {"action": "swipe", "coordinate": [500, 800], "coordinate2": [500, 200]}, None,
     call("mobile_use", action="swipe", coordinate=[505, 790], coordinate2=[500, 300]), 1.0, 1, 1, 1.0),
    ("m3", "mobile", {"action": "system_button", "button": "Back"}, None,
     call("mobile_use", action="system_button", button="home"), -0.5, 1, 1, None),
]
RESPONSES = {c[0]: c[4] for c in CASES}


def rows(cases=CASES, image_format="bytes", tmp_path=None):
    """verl RL rows: prompt with one <image> in the user turn, images as {"bytes": ...} or paths."""
    out = []
    for i, (sid, platform, action, bbox, *_rest) in enumerate(cases):
        shot = png(64, 48) if platform == "desktop" else png(36, 80)
        if image_format == "path":
            p = tmp_path / f"{sid}.png"
            p.write_bytes(shot)
            image = {"image": str(p)}  # prepare's image_mode="path"
        else:
            image = {"bytes": shot}
        out.append({
            "data_source": f"test_{platform}",
            "prompt": [
                {"role": "system", "content": system_prompt(platform)},
                {"role": "user", "content": f"Instruction: [{sid}] do the thing.\n\nPrevious actions:\nNone\n\n<image>"},
            ],
            "images": [image],
            "reward_model": {"style": "rule", "ground_truth": truth(platform, action, bbox)},
            "extra_info": {"platform": platform, "id": f"traj-{sid}", "index": 0, "step_id": sid, "bbox": bbox},
            "platform": platform,
        })
    return out


def write_parquet(path, rows_):
    pq.write_table(pa.Table.from_pylist(rows_), path)
    return str(path)

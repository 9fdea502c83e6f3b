"""mode="ui_mopd": the public UI-MOPD release's reward (verl/ui_mopd/reward/gui_agent.py), case by case.

Every expected value below was worked out by hand from reading the release's code.
"""

import json

import numpy as np
import pytest
from _reward_helpers import call, truth

from verl_mopd.rewards import compute_score

D, M = "desktop", "mobile"


def label(platform: str, **arguments) -> str:
    """A ground truth in the release's layout (a tool-call string)."""
    tool = {"desktop": "computer_use", "mobile": "mobile_use"}[platform]
    return "<tool_call>\n" + json.dumps({"name": tool, "arguments": arguments}) + "\n</tool_call>"


BOX = [[400, 400], [500, 500]]

# (id, ground truth, extra_info, response, expected score)
CASES = [
    ("click_in_box", label(M, action="click", coordinate=[450, 450]), {"bbox": BOX}, call(M, action="click", coordinate=[410, 490]), 1.0),
    ("click_box_edge_inclusive", label(M, action="click", coordinate=[450, 450]), {"bbox": BOX}, call(M, action="click", coordinate=[500, 400]), 1.0),
    ("click_box_not_enlarged", label(M, action="click", coordinate=[450, 450]), {"bbox": BOX}, call(M, action="click", coordinate=[501, 450]), -0.5),
    ("click_box_reversed_corners", label(M, action="click", coordinate=[450, 450]), {"bbox": [[500, 500], [400, 400]]}, call(M, action="click", coordinate=[450, 450]), 1.0),
    ("flat_box_never_contains", label(M, action="click", coordinate=[450, 450]), {"bbox": [400, 400, 500, 500]}, call(M, action="click", coordinate=[450, 450]), -0.5),
    ("no_box_exact_point", label(M, action="click", coordinate=[450, 450]), {}, call(M, action="click", coordinate=[450, 450]), 1.0),
    ("no_box_off_by_one", label(M, action="click", coordinate=[450, 450]), {}, call(M, action="click", coordinate=[451, 450]), -0.5),
    ("no_box_int_equals_float", label(M, action="click", coordinate=[450, 450]), {}, call(M, action="click", coordinate=[450.0, 450.0]), 1.0),
    ("no_box_string_coords_differ", label(M, action="click", coordinate=[450, 450]), {}, call(M, action="click", coordinate=["450", "450"]), -0.5),
    ("box_but_no_pred_point", label(M, action="click", coordinate=[450, 450]), {"bbox": BOX}, call(M, action="click"), -0.5),
    ("pred_tool_name_not_checked", label(M, action="click", coordinate=[450, 450]), {"bbox": BOX}, call(M, tool="computer_use", action="click", coordinate=[450, 450]), 1.0),
    ("no_action_aliases", label(M, action="click", coordinate=[450, 450]), {"bbox": BOX}, call(M, action="tap", coordinate=[450, 450]), -0.5),
    ("wrong_action", label(M, action="click", coordinate=[450, 450]), {"bbox": BOX}, call(M, action="long_press", coordinate=[450, 450]), -0.5),
    ("long_press_box", label(M, action="long_press", coordinate=[450, 450], time=2), {"bbox": BOX}, call(M, action="long_press", coordinate=[420, 420], time=9), 1.0),
    ("string_point_in_box_raises", label(M, action="click", coordinate=[450, 450]), {"bbox": BOX}, call(M, action="click", coordinate="ab"), -1.0),
    ("string_point_wrong_length", label(M, action="click", coordinate=[450, 450]), {"bbox": BOX}, call(M, action="click", coordinate="[450, 450]"), -0.5),
    ("nan_point_without_box", label(M, action="click", coordinate=[450, 450]), {}, "<tool_call>{\"name\": \"mobile_use\", \"arguments\": {\"action\": \"click\", \"coordinate\": [NaN, 450]}}</tool_call>", -0.5),
    ("off_grid_point_without_box", label(M, action="click", coordinate=[450, 450]), {}, call(M, action="click", coordinate=[4500, 450]), -0.5),
    # swipe: action + start (bbox) + end (bbox2)
    ("swipe_boxes", label(M, action="swipe", coordinate=[500, 800], coordinate2=[500, 200]), {"bbox": [[400, 700], [600, 900]], "bbox2": [[400, 100], [600, 300]]}, call(M, action="swipe", coordinate=[450, 750], coordinate2=[550, 150]), 1.0),
    ("swipe_end_outside_bbox2", label(M, action="swipe", coordinate=[500, 800], coordinate2=[500, 200]), {"bbox": [[400, 700], [600, 900]], "bbox2": [[400, 100], [600, 300]]}, call(M, action="swipe", coordinate=[450, 750], coordinate2=[550, 450]), -0.5),
    ("swipe_no_boxes_exact", label(M, action="swipe", coordinate=[500, 800], coordinate2=[500, 200]), {}, call(M, action="swipe", coordinate=[500, 800], coordinate2=[500, 200]), 1.0),
    ("swipe_no_boxes_same_direction_not_enough", label(M, action="swipe", coordinate=[500, 800], coordinate2=[500, 200]), {}, call(M, action="swipe", coordinate=[500, 800], coordinate2=[500, 100]), -0.5),
    ("swipe_start_box_end_exact", label(M, action="swipe", coordinate=[500, 800], coordinate2=[500, 200]), {"bbox": [[400, 700], [600, 900]]}, call(M, action="swipe", coordinate=[410, 710], coordinate2=[500, 200]), 1.0),
    # text: strip + lower only
    ("type_strip_lower", label(M, action="type", text="Hello"), {}, call(M, action="type", text="  hello "), 1.0),
    ("type_inner_spaces_differ", label(M, action="type", text="a b"), {}, call(M, action="type", text="a  b"), -0.5),
    ("answer_mobile", label(M, action="answer", text="42"), {}, call(M, action="answer", text="42"), 1.0),
    ("type_number_text_str", label(D, action="type", text="42"), {}, call(D, action="type", text=42), 1.0),
    ("type_desktop_wrong", label(D, action="type", text="abc"), {}, call(D, action="type", text="abd"), -0.5),
    # keys: lower-cased sets, no aliases
    ("keys_case_order", label(D, action="key", keys=["Ctrl", "C"]), {}, call(D, action="key", keys=["c", "ctrl"]), 1.0),
    ("keys_no_alias", label(D, action="key", keys=["ctrl", "c"]), {}, call(D, action="key", keys=["control", "c"]), -0.5),
    ("keys_duplicates_are_a_set", label(D, action="key", keys=["ctrl", "c"]), {}, call(D, action="key", keys=["ctrl", "c", "c"]), 1.0),
    ("keys_string_not_list", label(D, action="key", keys=["ctrl", "c"]), {}, call(D, action="key", keys="ctrl+c"), -0.5),
    ("keys_non_string_raises", label(D, action="key", keys=["ctrl", "c"]), {}, call(D, action="key", keys=[1, "c"]), -1.0),
    ("keys_raise_despite_wrong_action", label(D, action="key", keys=["ctrl"]), {}, call(D, action="type", keys=[1]), -1.0),
    # system_button, terminate, wait
    ("button_case_sensitive", label(M, action="system_button", button="Back"), {}, call(M, action="system_button", button="back"), -0.5),
    ("button_exact", label(M, action="system_button", button="Back"), {}, call(M, action="system_button", button="Back"), 1.0),
    ("terminate_status", label(M, action="terminate", status="success"), {}, call(M, action="terminate", status="success"), 1.0),
    ("terminate_status_wrong", label(D, action="terminate", status="success"), {}, call(D, action="terminate", status="failure"), -0.5),
    ("wait_time_ignored", label(M, action="wait", time=1), {}, call(M, action="wait", time=7), 1.0),
    ("wait_desktop", label(D, action="wait"), {}, call(D, action="wait"), 1.0),
    # desktop points, drag, scroll
    ("left_click_box", label(D, action="left_click", coordinate=[450, 450]), {"bbox": BOX}, call(D, action="left_click", coordinate=[401, 499]), 1.0),
    ("mouse_move_exact", label(D, action="mouse_move", coordinate=[1, 2]), {}, call(D, action="mouse_move", coordinate=[1, 2]), 1.0),
    ("drag_end_in_box", label(D, action="left_click_drag", coordinate=[450, 450]), {"bbox": BOX}, call(D, action="left_click_drag", coordinate=[420, 480]), 1.0),
    ("scroll_point_and_sign", label(D, action="scroll", coordinate=[450, 450], pixels=-5), {"bbox": BOX}, call(D, action="scroll", coordinate=[420, 420], pixels=-1), 1.0),
    ("scroll_wrong_sign", label(D, action="scroll", coordinate=[450, 450], pixels=-5), {"bbox": BOX}, call(D, action="scroll", coordinate=[420, 420], pixels=3), -0.5),
    ("scroll_point_needed", label(D, action="scroll", coordinate=[450, 450], pixels=-5), {"bbox": BOX}, call(D, action="scroll", pixels=-5), -0.5),
    ("scroll_no_point_anywhere", label(D, action="scroll", pixels=-5), {}, call(D, action="scroll", pixels=-5), -0.5),
    ("scroll_pixels_string_fails_part", label(D, action="scroll", coordinate=[1, 1], pixels=-5), {}, call(D, action="scroll", coordinate=[1, 1], pixels="-5"), -0.5),
    ("scroll_missing_pixels_both_zero", label(D, action="scroll", coordinate=[1, 1]), {}, call(D, action="scroll", coordinate=[1, 1]), 1.0),
    ("hscroll_sign", label(D, action="hscroll", coordinate=[1, 1], pixels=5), {}, call(D, action="hscroll", coordinate=[1, 1], pixels=1), 1.0),
    # actions missing from the release's tables score -1.0
    ("mobile_open_unscored", label(M, action="open", text="Maps"), {}, call(M, action="open", text="Maps"), -1.0),
    ("mobile_key_unscored", label(M, action="key", text="volume_up"), {}, call(M, action="key", text="volume_up"), -1.0),
    ("mobile_ask_user_unscored", label(M, action="ask_user", text="?"), {}, call(M, action="ask_user", text="?"), -1.0),
    ("desktop_answer_unscored", label(D, action="answer", text="42"), {}, call(D, action="answer", text="42"), -1.0),
    # parsing
    ("call_inside_think_is_read", label(M, action="wait"), {}, "<think><tool_call>{\"name\": \"mobile_use\", \"arguments\": {\"action\": \"wait\"}}</tool_call></think>", 1.0),
    ("first_call_taken", label(M, action="wait"), {}, call(M, action="wait") + call(M, think="", action="click", coordinate=[1, 1]), 1.0),
    ("first_call_taken_wrong", label(M, action="wait"), {}, call(M, action="click", coordinate=[1, 1]) + call(M, think="", action="wait"), -0.5),
    ("unclosed_block_unparsed", label(M, action="wait"), {}, "<tool_call>{\"name\": \"mobile_use\", \"arguments\": {\"action\": \"wait\"}}", -1.0),
    ("single_quotes_unparsed", label(M, action="wait"), {}, "<tool_call>{'name': 'mobile_use', 'arguments': {'action': 'wait'}}</tool_call>", -1.0),
    ("arguments_string_unparsed", label(M, action="wait"), {}, "<tool_call>{\"name\": \"mobile_use\", \"arguments\": \"{}\"}</tool_call>", -1.0),
    ("arguments_without_action", label(M, action="wait"), {}, "<tool_call>{\"name\": \"mobile_use\", \"arguments\": {}}</tool_call>", -1.0),
    ("call_is_list_raises", label(M, action="wait"), {}, "<tool_call>[1]</tool_call>", -1.0),
    ("bare_json_unparsed", label(M, action="wait"), {}, "{\"name\": \"mobile_use\", \"arguments\": {\"action\": \"wait\"}}", -1.0),
    ("no_call", label(M, action="wait"), {}, "nothing", -1.0),
    # labels
    ("label_unparseable", "not a call", {}, call(M, action="wait"), -1.0),
    ("label_unknown_tool", "<tool_call>{\"name\": \"tv_use\", \"arguments\": {\"action\": \"wait\"}}</tool_call>", {}, call(M, action="wait"), -1.0),
    # alternative label
    ("other_label_lifts", label(M, action="click", coordinate=[450, 450]), {"bbox": BOX, "other_label": label(M, action="system_button", button="Back")}, call(M, action="system_button", button="Back"), 1.0),
    ("other_label_not_matching", label(M, action="click", coordinate=[450, 450]), {"bbox": BOX, "other_label": label(M, action="system_button", button="Back")}, call(M, action="system_button", button="Home"), -0.5),
    ("other_label_own_box", label(M, action="click", coordinate=[450, 450]), {"bbox": BOX, "other_label": label(M, action="click", coordinate=[850, 850]), "other_bbox": [[800, 800], [900, 900]]}, call(M, action="click", coordinate=[810, 890]), 1.0),
    ("other_label_keeps_primary_box", label(M, action="click", coordinate=[450, 450]), {"bbox": BOX, "other_label": label(M, action="click", coordinate=[850, 850])}, call(M, action="click", coordinate=[850, 850]), -0.5),
    ("other_label_cannot_lower", label(M, action="wait"), {"other_label": "garbage"}, call(M, action="wait"), 1.0),
    ("other_label_lifts_invalid", label(M, action="open", text="x"), {"other_label": label(M, action="wait")}, call(M, action="wait"), 1.0),
]


@pytest.mark.parametrize("gt,extra,response,score", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_release_table(gt, extra, response, score):
    r = compute_score("test", response, gt, extra, mode="ui_mopd")
    assert r["score"] == score
    assert r["acc"] == (1.0 if score == 1.0 else 0.0)


def test_our_json_layout_in_release_mode():
    gt = truth(M, [400, 400, 500, 500], action="click", coordinate=[450, 450])
    assert compute_score("t", call(M, action="click", coordinate=[500, 400]), gt, mode="ui_mopd")["score"] == 1.0
    # strict enlarges the box x1.2, the release does not
    near = call(M, action="click", coordinate=[505, 450])
    assert compute_score("t", near, gt, mode="ui_mopd")["score"] == -0.5
    assert compute_score("t", near, gt)["score"] == 1.0
    gt = truth(D, action="key", keys=["Control", "c"])  # the raw label is compared, no aliases
    assert compute_score("t", call(D, action="key", keys=["control", "C"]), gt, mode="ui_mopd")["score"] == 1.0
    assert compute_score("t", call(D, action="key", keys=["ctrl", "c"]), gt, mode="ui_mopd")["score"] == -0.5
    gt = truth(M, action="click", coordinate=[450, 450])
    gt["alternatives"] = [{"action": {"action": "click", "coordinate": [10, 10]}, "bbox": [0, 0, 20, 20]}]
    assert compute_score("t", call(M, action="click", coordinate=[19, 1]), gt, mode="ui_mopd")["reason"] == "ok:alternative"


def test_release_layout_in_strict_mode():
    gt = label(M, action="click", coordinate=[450, 450])
    r = compute_score("t", call(M, action="tap", coordinate=[505, 450]), gt, {"bbox": BOX})
    assert (r["score"], r["platform"]) == (1.0, "mobile")
    r = compute_score("t", call(M, action="system_button", button="back"), gt, {"bbox": BOX, "other_label": label(M, action="system_button", button="Back")})
    assert r["reason"] == "ok:alternative"
    # strict mode checks the prediction's tool name
    assert compute_score("t", call(M, tool="computer_use", action="click", coordinate=[450, 450]), gt, {"bbox": BOX})["score"] == -1.0


def test_numpy_boxes_and_none_extra_info():
    gt = label(M, action="click", coordinate=[450, 450])
    r = compute_score("t", call(M, action="click", coordinate=[420, 420]), gt, {"bbox": np.array(BOX)}, mode="ui_mopd")
    assert r["score"] == 1.0
    assert compute_score("t", call(M, action="click", coordinate=[450, 450]), gt, None, mode="ui_mopd")["score"] == 1.0


@pytest.mark.parametrize(
    "text,expected",
    [
        ("<think> abc </think>" + call(M, think="", action="wait"), 3),
        ("abcd\n</think>" + call(M, think="", action="wait"), 4),
        ("<thinking>xy</thinking>rest", 2),
        ("<think>ab", 0),
        (call(M, think="", action="wait"), 0),
        ("pre <think>a</think> b </think>", 1),
    ],
)
def test_thought_length(text, expected):
    gt = label(M, action="wait")
    assert compute_score("t", text, gt, mode="ui_mopd")["thought_length"] == expected
    assert compute_score("t", text, gt)["thought_length"] == expected


def test_thought_length_with_tokenizer():
    class Words:
        def encode(self, s):
            return s.split()

    r = compute_score("t", "<think>one two three</think>", label(M, action="wait"), {"tokenizer": Words()}, mode="ui_mopd")
    assert r["thought_length"] == 3


def test_release_mode_takes_no_tolerances():
    with pytest.raises(ValueError, match="ui_mopd"):
        compute_score("t", "x", label(M, action="wait"), mode="ui_mopd", point_tolerance=0.1)
    # verl's own extra kwargs are accepted
    assert compute_score("t", call(M, action="wait"), label(M, action="wait"), mode="ui_mopd", reward_router_address=None)["score"] == 1.0

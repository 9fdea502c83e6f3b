"""Strict-mode reward: a table of cases, one row per rule (family, level, alias, edge, malformation)."""

import pytest
from _reward_helpers import call, truth

from verl_mopd.rewards import compute_score
from verl_mopd.rewards.score import ScoreConfig, edit_similarity, token_f1

D, M = "desktop", "mobile"
CLICK_BOX = [400, 400, 500, 500]  # centre (450, 450), half-size 50; x1.2 -> 390..510

# (id, ground truth, response, expected score, expected reason)
CASES = [
    # --- point actions, with a box (enlarged x1.2)
    ("click_in_box", truth(M, CLICK_BOX, action="click", coordinate=[450, 450]), call(M, action="click", coordinate=[410, 490]), 1.0, "ok"),
    ("click_box_edge_scaled", truth(M, CLICK_BOX, action="click", coordinate=[450, 450]), call(M, action="click", coordinate=[510, 390]), 1.0, "ok"),
    ("click_just_outside_scaled", truth(M, CLICK_BOX, action="click", coordinate=[450, 450]), call(M, action="click", coordinate=[510.5, 450]), -0.5, "partial:coordinate"),
    ("click_outside_box_near_point", truth(M, CLICK_BOX, action="click", coordinate=[450, 450]), call(M, action="click", coordinate=[450, 515]), -0.5, "partial:coordinate"),
    ("long_press_in_box", truth(M, CLICK_BOX, action="long_press", coordinate=[450, 450], time=2), call(M, action="long_press", coordinate=[450, 450]), 1.0, "ok"),
    ("desktop_left_click_box", truth(D, CLICK_BOX, action="left_click", coordinate=[450, 450]), call(D, action="left_click", coordinate=[401, 401]), 1.0, "ok"),
    ("desktop_double_click_box_miss", truth(D, CLICK_BOX, action="double_click", coordinate=[450, 450]), call(D, action="double_click", coordinate=[700, 700]), -0.5, "partial:coordinate"),
    ("desktop_click_missing_point", truth(D, CLICK_BOX, action="left_click", coordinate=[450, 450]), call(D, action="left_click"), -0.5, "partial:coordinate"),
    # --- point actions without a box: distance <= 0.04 of the screen (40 grid units)
    ("click_distance_inside", truth(M, action="click", coordinate=[500, 500]), call(M, action="click", coordinate=[524, 532]), 1.0, "ok"),
    ("click_distance_edge", truth(M, action="click", coordinate=[500, 500]), call(M, action="click", coordinate=[540, 500]), 1.0, "ok"),
    ("click_distance_outside", truth(M, action="click", coordinate=[500, 500]), call(M, action="click", coordinate=[541, 500]), -0.5, "partial:coordinate"),
    ("right_click_distance", truth(D, action="right_click", coordinate=[100, 100]), call(D, action="right_click", coordinate=[100.5, 99.5]), 1.0, "ok"),
    ("middle_click_far", truth(D, action="middle_click", coordinate=[100, 100]), call(D, action="middle_click", coordinate=[900, 900]), -0.5, "partial:coordinate"),
    ("triple_click", truth(D, action="triple_click", coordinate=[300, 300]), call(D, action="triple_click", coordinate=[310, 290]), 1.0, "ok"),
    ("mouse_move", truth(D, action="mouse_move", coordinate=[300, 300]), call(D, action="mouse_move", coordinate=[300, 300]), 1.0, "ok"),
    ("coordinate_strings", truth(M, action="click", coordinate=[500, 500]), call(M, action="click", coordinate=["500", "501.5"]), 1.0, "ok"),
    ("coordinate_one_string", truth(M, action="click", coordinate=[500, 500]), call(M, action="click", coordinate="[500, 500]"), 1.0, "ok"),
    ("coordinate_floats", truth(M, action="click", coordinate=[500, 500]), call(M, action="click", coordinate=[500.25, 499.75]), 1.0, "ok"),
    ("grid_corner_0", truth(M, action="click", coordinate=[0, 0]), call(M, action="click", coordinate=[0, 0]), 1.0, "ok"),
    ("grid_corner_1000", truth(M, action="click", coordinate=[1000, 1000]), call(M, action="click", coordinate=[1000, 1000]), 1.0, "ok"),
    ("off_grid_x", truth(M, action="click", coordinate=[500, 500]), call(M, action="click", coordinate=[1001, 500]), -1.0, "invalid:out_of_grid"),
    ("off_grid_negative", truth(M, action="click", coordinate=[500, 500]), call(M, action="click", coordinate=[-1, 500]), -1.0, "invalid:out_of_grid"),
    ("coordinate_three_values", truth(M, action="click", coordinate=[500, 500]), call(M, action="click", coordinate=[1, 2, 3]), -1.0, "invalid:bad_type"),
    ("coordinate_bool", truth(M, action="click", coordinate=[500, 500]), call(M, action="click", coordinate=[True, 2]), -1.0, "invalid:bad_type"),
    ("coordinate_nan", truth(M, action="click", coordinate=[500, 500]), "<tool_call>{\"name\": \"mobile_use\", \"arguments\": {\"action\": \"click\", \"coordinate\": [NaN, 5]}}</tool_call>", -1.0, "invalid:not_finite"),
    ("coordinate_inf", truth(M, action="click", coordinate=[500, 500]), "<tool_call>{\"name\": \"mobile_use\", \"arguments\": {\"action\": \"click\", \"coordinate\": [Infinity, 5]}}</tool_call>", -1.0, "invalid:not_finite"),
    ("mobile_click_missing_coordinate", truth(M, action="click", coordinate=[500, 500]), call(M, action="click"), -1.0, "invalid:missing_arg"),
    # --- wrong action is partial
    ("wrong_action", truth(M, action="click", coordinate=[500, 500]), call(M, action="long_press", coordinate=[500, 500]), -0.5, "partial:action"),
    ("wrong_action_desktop", truth(D, action="left_click", coordinate=[500, 500]), call(D, action="double_click", coordinate=[500, 500]), -0.5, "partial:action"),
    # --- action aliases
    ("alias_tap", truth(M, action="click", coordinate=[500, 500]), call(M, action="tap", coordinate=[500, 500]), 1.0, "ok"),
    ("alias_click_desktop", truth(D, action="left_click", coordinate=[500, 500]), call(D, action="click", coordinate=[500, 500]), 1.0, "ok"),
    ("alias_press_desktop", truth(D, action="key", keys=["ctrl", "c"]), call(D, action="press", keys=["ctrl", "c"]), 1.0, "ok"),
    ("alias_open_app", truth(M, action="open", text="Settings"), call(M, action="open_app", text="settings"), 1.0, "ok"),
    ("action_case", truth(M, action="click", coordinate=[500, 500]), call(M, action="Click", coordinate=[500, 500]), 1.0, "ok"),
    # --- swipe: direction (dominant axis + sign) and start point
    ("swipe_up", truth(M, action="swipe", coordinate=[500, 800], coordinate2=[500, 200]), call(M, action="swipe", coordinate=[510, 790], coordinate2=[530, 300]), 1.0, "ok"),
    ("swipe_wrong_direction", truth(M, action="swipe", coordinate=[500, 800], coordinate2=[500, 200]), call(M, action="swipe", coordinate=[500, 800], coordinate2=[500, 900]), -0.5, "partial:direction"),
    ("swipe_wrong_axis", truth(M, action="swipe", coordinate=[500, 800], coordinate2=[500, 200]), call(M, action="swipe", coordinate=[500, 800], coordinate2=[100, 700]), -0.5, "partial:direction"),
    ("swipe_start_off", truth(M, action="swipe", coordinate=[500, 800], coordinate2=[500, 200]), call(M, action="swipe", coordinate=[500, 600], coordinate2=[500, 100]), -0.5, "partial:coordinate"),
    ("swipe_start_in_box", truth(M, [400, 700, 600, 900], action="swipe", coordinate=[500, 800], coordinate2=[500, 200]), call(M, action="swipe", coordinate=[590, 880], coordinate2=[590, 500]), 1.0, "ok"),
    ("swipe_too_short_has_no_direction", truth(M, action="swipe", coordinate=[500, 800], coordinate2=[500, 200]), call(M, action="swipe", coordinate=[500, 800], coordinate2=[500, 770]), -0.5, "partial:direction"),
    ("swipe_both_short", truth(M, action="swipe", coordinate=[500, 800], coordinate2=[500, 790]), call(M, action="swipe", coordinate=[500, 800], coordinate2=[520, 800]), 1.0, "ok"),
    ("swipe_missing_end", truth(M, action="swipe", coordinate=[500, 800], coordinate2=[500, 200]), call(M, action="swipe", coordinate=[500, 800]), -1.0, "invalid:missing_arg"),
    # --- desktop drag
    ("drag_end_only", truth(D, action="left_click_drag", coordinate=[700, 300]), call(D, action="left_click_drag", coordinate=[710, 310]), 1.0, "ok"),
    ("drag_end_only_miss", truth(D, action="left_click_drag", coordinate=[700, 300]), call(D, action="left_click_drag", coordinate=[100, 300]), -0.5, "partial:coordinate"),
    ("drag_two_points", truth(D, action="left_click_drag", coordinate=[100, 100], coordinate2=[600, 120]), call(D, action="left_click_drag", coordinate=[105, 100], coordinate2=[400, 100]), 1.0, "ok"),
    ("drag_two_points_wrong_dir", truth(D, action="left_click_drag", coordinate=[100, 100], coordinate2=[600, 120]), call(D, action="left_click_drag", coordinate=[105, 100], coordinate2=[100, 500]), -0.5, "partial:direction"),
    # --- scroll / hscroll: sign of pixels
    ("scroll_down", truth(D, action="scroll", pixels=-300), call(D, action="scroll", pixels=-5), 1.0, "ok"),
    ("scroll_wrong_sign", truth(D, action="scroll", pixels=-300), call(D, action="scroll", pixels=300), -0.5, "partial:pixels"),
    ("scroll_point_ignored", truth(D, action="scroll", pixels=200, coordinate=[100, 100]), call(D, action="scroll", pixels=1, coordinate=[900, 900]), 1.0, "ok"),
    ("scroll_pixels_string", truth(D, action="scroll", pixels=-300), call(D, action="scroll", pixels="-3"), 1.0, "ok"),
    ("scroll_missing_pixels", truth(D, action="scroll", pixels=-300), call(D, action="scroll"), -1.0, "invalid:missing_arg"),
    ("hscroll_right", truth(D, action="hscroll", pixels=100), call(D, action="hscroll", pixels=40), 1.0, "ok"),
    ("hscroll_vs_scroll", truth(D, action="hscroll", pixels=100), call(D, action="scroll", pixels=100), -0.5, "partial:action"),
    # --- text
    ("type_exact", truth(M, action="type", text="hello world"), call(M, action="type", text="hello world"), 1.0, "ok"),
    ("type_case_space", truth(M, action="type", text="Hello  World"), call(M, action="type", text="  hello world "), 1.0, "ok"),
    ("type_edit_similar", truth(D, action="type", text="weather in paris"), call(D, action="type", text="weather in pariss"), 1.0, "ok"),
    ("type_different", truth(D, action="type", text="weather in paris"), call(D, action="type", text="flights to rome"), -0.5, "partial:text"),
    ("type_empty_pred", truth(D, action="type", text="abc"), call(D, action="type", text=""), -0.5, "partial:text"),
    ("type_not_string", truth(D, action="type", text="abc"), call(D, action="type", text=5), -1.0, "invalid:bad_type"),
    ("answer_desktop", truth(D, action="answer", text="42"), call(D, action="answer", text=" 42 "), 1.0, "ok"),
    ("answer_mobile_wrong", truth(M, action="answer", text="42"), call(M, action="answer", text="43"), -0.5, "partial:text"),
    ("open_app", truth(M, action="open", text="Google Maps"), call(M, action="open", text="google maps"), 1.0, "ok"),
    ("ask_user", truth(M, action="ask_user", text="Which account?"), call(M, action="ask_user", text="which account?"), 1.0, "ok"),
    ("nfkc_fullwidth", truth(M, action="type", text="abc123"), call(M, action="type", text="ａｂｃ１２３"), 1.0, "ok"),
    # --- keys: set, order-insensitive, aliases
    ("keys_order", truth(D, action="key", keys=["ctrl", "shift", "t"]), call(D, action="key", keys=["shift", "ctrl", "t"]), 1.0, "ok"),
    ("keys_alias_control", truth(D, action="key", keys=["ctrl", "c"]), call(D, action="key", keys=["Control", "C"]), 1.0, "ok"),
    ("keys_alias_cmd_win", truth(D, action="key", keys=["cmd", "space"]), call(D, action="key", keys=["win", "space"]), 1.0, "ok"),
    ("keys_alias_meta_super", truth(D, action="key", keys=["super"]), call(D, action="key", keys=["meta"]), 1.0, "ok"),
    ("keys_alias_return", truth(D, action="key", keys=["enter"]), call(D, action="key", keys=["Return"]), 1.0, "ok"),
    ("keys_alias_esc", truth(D, action="key", keys=["escape"]), call(D, action="key", keys=["esc"]), 1.0, "ok"),
    ("keys_plus_string", truth(D, action="key", keys=["ctrl", "a"]), call(D, action="key", keys="ctrl+a"), 1.0, "ok"),
    ("keys_missing_one", truth(D, action="key", keys=["ctrl", "shift", "t"]), call(D, action="key", keys=["ctrl", "t"]), -0.5, "partial:keys"),
    ("keys_empty_list", truth(D, action="key", keys=["ctrl"]), call(D, action="key", keys=[]), -1.0, "invalid:bad_type"),
    ("mobile_key", truth(M, action="key", text="volume_up"), call(M, action="key", text="KEYCODE_VOLUME_UP"), 1.0, "ok"),
    ("mobile_key_wrong", truth(M, action="key", text="volume_up"), call(M, action="key", text="volume_down"), -0.5, "partial:text"),
    # --- system_button: case-insensitive, unknown button invalid
    ("button_case", truth(M, action="system_button", button="Back"), call(M, action="system_button", button="back"), 1.0, "ok"),
    ("button_wrong", truth(M, action="system_button", button="Back"), call(M, action="system_button", button="Home"), -0.5, "partial:button"),
    ("button_unknown", truth(M, action="system_button", button="Back"), call(M, action="system_button", button="Recent"), -1.0, "invalid:bad_value"),
    # --- terminate / wait
    ("terminate_success", truth(M, action="terminate", status="success"), call(M, action="terminate", status="success"), 1.0, "ok"),
    ("terminate_wrong_status", truth(D, action="terminate", status="success"), call(D, action="terminate", status="failure"), -0.5, "partial:status"),
    ("terminate_alias_failed", truth(D, action="terminate", status="failure"), call(D, action="terminate", status="failed"), 1.0, "ok"),
    ("terminate_unknown_status", truth(D, action="terminate", status="success"), call(D, action="terminate", status="maybe"), -1.0, "invalid:bad_value"),
    ("wait_any_time", truth(M, action="wait", time=2), call(M, action="wait", time=5), 1.0, "ok"),
    ("wait_no_time", truth(D, action="wait"), call(D, action="wait"), 1.0, "ok"),
    # --- tool name and platform action sets
    ("wrong_tool_name", truth(M, action="click", coordinate=[500, 500]), call(M, tool="computer_use", action="click", coordinate=[500, 500]), -1.0, "invalid:wrong_tool"),
    ("desktop_action_on_mobile", truth(M, action="click", coordinate=[500, 500]), call(M, action="left_click", coordinate=[500, 500]), -1.0, "invalid:unknown_action"),
    ("mobile_action_on_desktop", truth(D, action="left_click", coordinate=[500, 500]), call(D, action="swipe", coordinate=[5, 5], coordinate2=[9, 9]), -1.0, "invalid:unknown_action"),
    ("answer_not_a_desktop_button", truth(D, action="answer", text="x"), call(D, action="system_button", button="Back"), -1.0, "invalid:unknown_action"),
    # --- malformed JSON and wrappers
    ("no_json", truth(M, action="wait"), "I will wait now.", -1.0, "invalid:no_call"),
    ("empty", truth(M, action="wait"), "", -1.0, "invalid:no_call"),
    ("invalid_json", truth(M, action="wait"), "<tool_call>{\"name\": \"mobile_use\", \"arguments\": {\"action\": wait}}</tool_call>", -1.0, "invalid:invalid_json"),
    ("truncated_json", truth(M, action="wait"), "<tool_call>{\"name\": \"mobile_use\", \"arguments\": {\"action\": \"wa", -1.0, "invalid:invalid_json"),
    ("single_quotes", truth(M, action="wait"), "<tool_call>{'name': 'mobile_use', 'arguments': {'action': 'wait'}}</tool_call>", 1.0, "ok"),
    ("trailing_commas", truth(M, action="click", coordinate=[5, 5]), "<tool_call>{\"name\": \"mobile_use\", \"arguments\": {\"action\": \"click\", \"coordinate\": [5, 5,],},}</tool_call>", 1.0, "ok"),
    ("arguments_as_string", truth(M, action="wait"), "<tool_call>{\"name\": \"mobile_use\", \"arguments\": \"{\\\"action\\\": \\\"wait\\\"}\"}</tool_call>", 1.0, "ok"),
    ("unclosed_final_block", truth(M, action="wait"), "</think><tool_call>\n{\"name\": \"mobile_use\", \"arguments\": {\"action\": \"wait\"}}", 1.0, "ok"),
    ("bare_json", truth(M, action="wait"), "Action: {\"name\": \"mobile_use\", \"arguments\": {\"action\": \"wait\"}}", 1.0, "ok"),
    ("fenced_json", truth(M, action="wait"), "```json\n{\"name\": \"mobile_use\", \"arguments\": {\"action\": \"wait\"}}\n```", 1.0, "ok"),
    ("fenced_inside_tags", truth(M, action="wait"), "<tool_call>\n```json\n{\"name\": \"mobile_use\", \"arguments\": {\"action\": \"wait\"}}\n```\n</tool_call>", 1.0, "ok"),
    ("json_without_name", truth(M, action="wait"), "<tool_call>{\"action\": \"wait\"}</tool_call>", -1.0, "invalid:bad_call"),
    ("arguments_not_object", truth(M, action="wait"), "<tool_call>{\"name\": \"mobile_use\", \"arguments\": [1]}</tool_call>", -1.0, "invalid:bad_call"),
    ("call_is_a_list", truth(M, action="wait"), "<tool_call>[1, 2]</tool_call>", -1.0, "invalid:invalid_json"),
    ("missing_action_field", truth(M, action="wait"), call(M, coordinate=[1, 2]), -1.0, "invalid:missing_action"),
    # --- thinking
    ("thinking_closed_tag_only", truth(M, action="wait"), "I think I should wait.\n</think>\n" + call(M, think="", action="wait"), 1.0, "ok"),
    ("thinking_full_block", truth(M, action="wait"), "<think>hmm</think>" + call(M, think="", action="wait"), 1.0, "ok"),
    ("call_inside_unclosed_think", truth(M, action="wait"), "<think>maybe " + call(M, think="", action="wait"), -1.0, "invalid:unclosed_think"),
    ("call_only_inside_think", truth(M, action="wait"), "<think>" + call(M, think="", action="wait") + "</think> done", -1.0, "invalid:no_call"),
    ("thinking_variant_tag", truth(M, action="wait"), "<thinking>x</thinking>" + call(M, think="", action="wait"), 1.0, "ok"),
    ("reopened_think_after_close", truth(M, action="wait"), "</think><think> " + call(M, think="", action="wait"), -1.0, "invalid:unclosed_think"),
    # --- several calls: the first one counts
    ("first_of_two_calls", truth(M, action="wait"), call(M, action="wait") + call(M, think="", action="click", coordinate=[1, 1]), 1.0, "ok"),
    ("first_of_two_wrong", truth(M, action="wait"), call(M, action="click", coordinate=[1, 1]) + call(M, think="", action="wait"), -0.5, "partial:action"),
    # --- too long
    ("too_long", truth(M, action="wait"), "x" * 300_000 + call(M, action="wait"), -1.0, "invalid:too_long"),
]


@pytest.mark.parametrize("gt,response,score,reason", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_strict_table(gt, response, score, reason):
    r = compute_score("test", response, gt)
    assert (r["score"], r["reason"]) == (score, reason)
    assert r["acc"] == (1.0 if score == 1.0 else 0.0)
    assert r["parsed"] == (0.0 if reason.startswith("invalid") else 1.0)
    assert r["action_match"] == (1.0 if reason == "ok" or reason.startswith("partial:") and reason != "partial:action" else 0.0)


def test_table_size_and_coverage():
    assert len(CASES) >= 60
    levels = {c[3] for c in CASES}
    assert levels == {1.0, -0.5, -1.0}


def test_multiple_calls_reject_option():
    gt = truth(M, action="wait")
    text = call(M, action="wait") + call(M, think="", action="wait")
    assert compute_score("t", text, gt)["score"] == 1.0
    r = compute_score("t", text, gt, multiple_calls="reject")
    assert (r["score"], r["reason"]) == (-1.0, "invalid:multiple_calls")
    bare = '{"name": "mobile_use", "arguments": {"action": "wait"}} {"name": "mobile_use", "arguments": {"action": "wait"}}'
    assert compute_score("t", bare, gt, multiple_calls="reject")["reason"] == "invalid:multiple_calls"


def test_aliases_can_be_turned_off():
    gt = truth(M, action="click", coordinate=[500, 500])
    r = compute_score("t", call(M, action="tap", coordinate=[500, 500]), gt, action_aliases=False)
    assert r["reason"] == "invalid:unknown_action"


def test_levels_and_tolerances_configurable():
    gt = truth(M, action="click", coordinate=[500, 500])
    far = call(M, action="click", coordinate=[600, 500])
    assert compute_score("t", far, gt, partial=0.0)["score"] == 0.0
    assert compute_score("t", "junk", gt, invalid=-2.0)["score"] == -2.0
    assert compute_score("t", far, gt, point_tolerance=0.1)["score"] == 1.0
    assert compute_score("t", far, gt, preset="aitw")["score"] == 1.0  # 0.10 <= 0.14
    assert compute_score("t", far, gt, preset="agentnet")["score"] == -0.5  # 0.10 > 0.0141


def test_presets_point_rules():
    box = [400, 400, 500, 500]
    gt = truth(M, box, action="click", coordinate=[450, 450])
    just_out = call(M, action="click", coordinate=[505, 450])  # outside the box, inside x1.2
    assert compute_score("t", just_out, gt)["score"] == 1.0
    assert compute_score("t", just_out, gt, preset="gui_r1")["score"] == 1.0  # within 0.14 of the point
    assert compute_score("t", just_out, gt, preset="gui_r1", point_tolerance=0.01)["score"] == -0.5
    assert compute_score("t", just_out, gt, bbox_scale=1.0)["score"] == -0.5
    far_in_tolerance = call(M, action="click", coordinate=[560, 450])
    assert compute_score("t", far_in_tolerance, gt, preset="os_atlas")["score"] == 1.0  # box ignored, 0.11
    assert compute_score("t", far_in_tolerance, gt, point_or_distance=True)["score"] == -0.5  # 0.11 > 0.04


def test_text_rules():
    gt = truth(D, action="type", text="the quick brown fox")
    f1_only = call(D, action="type", text="quick fox the")  # token F1 = 0.857, edit similarity low
    assert compute_score("t", f1_only, gt)["score"] == -0.5
    assert compute_score("t", f1_only, gt, preset="os_atlas")["score"] == 1.0
    assert compute_score("t", f1_only, gt, text_edit_similarity=None, text_f1=0.9)["score"] == -0.5
    case = call(D, action="type", text="THE QUICK BROWN FOX")
    assert compute_score("t", case, gt, text_case_sensitive=True, text_edit_similarity=None)["score"] == -0.5


def test_edit_similarity_and_f1_against_definitions():
    assert edit_similarity("kitten", "sitting") == pytest.approx(1 - 3 / 7)
    assert edit_similarity("", "") == 1.0 and edit_similarity("a", "") == 0.0
    assert token_f1("a b c", "a b d") == pytest.approx(2 / 3)


def test_swipe_end_option():
    gt = truth(M, action="swipe", coordinate=[500, 800], coordinate2=[500, 200])
    gt["bbox2"] = [450, 150, 550, 250]
    short = call(M, action="swipe", coordinate=[500, 800], coordinate2=[500, 500])
    assert compute_score("t", short, gt)["score"] == 1.0
    assert compute_score("t", short, gt, swipe_check_end=True)["reason"] == "partial:coordinate2"


def test_scroll_point_option():
    gt = truth(D, [0, 0, 100, 100], action="scroll", pixels=-3, coordinate=[50, 50])
    elsewhere = call(D, action="scroll", pixels=-1, coordinate=[900, 900])
    assert compute_score("t", elsewhere, gt)["score"] == 1.0
    assert compute_score("t", elsewhere, gt, scroll_check_point=True)["reason"] == "partial:coordinate"


def test_alternative_labels():
    gt = truth(M, [0, 0, 100, 100], action="click", coordinate=[50, 50])
    gt["alternatives"] = [{"action": {"action": "system_button", "button": "Back"}}]
    assert compute_score("t", call(M, action="system_button", button="Back"), gt)["reason"] == "ok:alternative"
    assert compute_score("t", call(M, action="system_button", button="Home"), gt)["score"] == -0.5
    assert compute_score("t", call(M, action="click", coordinate=[50, 50]), gt)["reason"] == "ok"


def test_bad_config_and_truth_errors_name_the_field():
    gt = truth(M, action="wait")
    with pytest.raises(ValueError, match="bbox_scal"):
        compute_score("t", "x", gt, bbox_scal=1.0)
    with pytest.raises(ValueError, match="correct > partial"):
        compute_score("t", "x", gt, partial=2.0)
    with pytest.raises(ValueError, match="preset"):
        compute_score("t", "x", gt, preset="nope")
    with pytest.raises(ValueError, match="mode"):
        compute_score("t", "x", gt, mode="loose")
    with pytest.raises(ValueError, match="ground_truth.platform"):
        compute_score("t", "x", {"platform": "tv", "action": {"action": "wait"}})
    with pytest.raises(ValueError, match=r"ground_truth.action.*coordinate"):
        compute_score("t", "x", truth(M, action="click"))
    with pytest.raises(ValueError, match="bbox"):
        compute_score("t", "x", truth(M, [1, 2, 3], action="click", coordinate=[1, 1]))
    r = compute_score("t", "x", {"platform": "tv"}, bad_truth="invalid")
    assert (r["score"], r["reason"]) == (-1.0, "invalid:ground_truth")
    with pytest.raises(ValueError, match="bad_truth"):
        ScoreConfig(bad_truth="skip")

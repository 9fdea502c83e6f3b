"""The smoke's two checks that hold on a GPU too (where SGLang's weights cannot be hashed), on hand-made
dumps: each passes on what a correct run leaves and fails on a tampered copy.

- each step, the rollout's probability of every token it sampled equals the actor's (``rollout_log_probs``
  against ``old_log_probs``) within the profile's tolerance;
- at every step after the first, the actor's probabilities differ from the starting student's (a direct
  forward of its checkpoint) by more than that tolerance, so a rollout left on the starting weights fails
  the first check.
"""

import math

import pytest
import torch

from verl_mopd.testing import smoke, tiny

TOLERANCE = 0.05


def _row(student, rollout, mask=None, padding=False):
    student = torch.tensor(student, dtype=torch.float32)
    return {"padding": padding, "student": student,
            "rollout": None if rollout is None else torch.tensor(rollout, dtype=torch.float32),
            "response_mask": torch.ones(len(student), dtype=torch.long) if mask is None else torch.tensor(mask)}


def _log(p: float) -> float:
    return math.log(p)


def test_rollout_probabilities_equal_to_the_actors_pass():
    rows = [_row([_log(0.5), _log(0.9)], [_log(0.5), _log(0.9)]), _row([_log(0.2)], [_log(0.2 + 0.04)])]
    ok, detail = smoke._check_rollout_probs(rows, TOLERANCE)
    assert ok, detail
    assert "3 tokens" in detail


@pytest.mark.parametrize("rollout_p, ok", [(0.5 + 0.049, True), (0.5 + 0.051, False), (0.5 - 0.051, False)])
def test_a_rollout_probability_off_by_more_than_the_tolerance_fails(rollout_p, ok):
    rows = [_row([_log(0.9), _log(0.5)], [_log(0.9), _log(rollout_p)])]
    assert smoke._check_rollout_probs(rows, TOLERANCE)[0] is ok


def test_a_stale_rollout_fails_where_the_student_moved():
    """The rollout sampled with the starting weights (its probabilities are the starting student's) while
    the actor moved by 0.3: what the GPU check must catch."""
    start = [_log(0.4), _log(0.7)]
    moved = [_log(0.7), _log(0.7)]
    assert not smoke._check_rollout_probs([_row(moved, start)], TOLERANCE)[0]
    assert smoke._check_rollout_probs([_row(moved, moved)], TOLERANCE)[0]


def test_masked_tokens_and_padding_rows_do_not_count_but_a_missing_field_fails():
    masked = _row([_log(0.5), _log(0.5)], [_log(0.5), _log(0.99)], mask=[1, 0])
    padding = _row([_log(0.5)], [_log(0.99)], padding=True)
    assert smoke._check_rollout_probs([masked, padding], TOLERANCE)[0]
    ok, detail = smoke._check_rollout_probs([_row([_log(0.5)], None)], TOLERANCE)
    assert not ok and "rollout_log_probs" in detail
    assert not smoke._check_rollout_probs([padding], TOLERANCE)[0]  # no token compared is not a pass


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run folder with the tiny student the smoke starts from, and one text-only sample's response."""
    root = tmp_path_factory.mktemp("run")
    paths = smoke.Paths(root, root)
    texts = ["the quick brown fox jumps over the lazy dog", '{"action": "click", "coordinate": [1, 2]}'] * 4
    tokenizer = tiny.build_tokenizer(texts)
    path = tiny.save_model(paths.models / "student", tokenizer, tiny.build_processor(tokenizer), "student", seed=0)
    ids = torch.tensor(tokenizer(texts[0] + texts[1])["input_ids"])
    n = 8
    row = {"padding": False, "input_ids": ids, "response_mask": torch.ones(n, dtype=torch.long),
           "multi_modal_inputs": None, "student": torch.zeros(n)}
    model = smoke._starting_student(paths, smoke.PROFILES["cpu"], [row])
    assert len(model) == 1 and path.is_dir()
    return paths, row, model[0][1].float()


def _moved(start, shift):
    """``start``'s log-probs with one token's probability moved by ``shift`` (towards the side with room)."""
    probs = start.double().exp()
    probs[3] = probs[3] + shift if probs[3] < 0.5 else probs[3] - shift
    return probs.log().float()


@pytest.mark.parametrize("shifts, ok", [((0.2, 0.2), True), ((0.0, 0.2), False), ((0.2, 0.04), False),
                                        ((0.04, 0.04), False)])
def test_the_student_moved_check_needs_every_later_steps_probabilities_past_the_tolerance(run, shifts, ok):
    paths, row, start = run
    dumps = {1: [{**row, "student": start}], **{step: [{**row, "student": _moved(start, shift)}]
                                                for step, shift in zip((2, 3), shifts, strict=True)}}
    passed, detail = smoke._check_student_moved(paths, smoke.PROFILES["cpu"], dumps)
    assert passed is ok, detail
    assert detail.startswith("max |p_actor - p_starting student| step 2 ")


def test_the_student_moved_check_needs_a_step_after_the_first(run):
    paths, row, start = run
    assert not smoke._check_student_moved(paths, smoke.PROFILES["cpu"], {1: [{**row, "student": start}]})[0]

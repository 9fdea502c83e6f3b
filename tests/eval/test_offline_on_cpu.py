"""Offline evaluation: parquet -> messages -> (HTTP server | tiny transformers model) -> reward -> metrics."""

import base64
import json
import re
import threading
import time

import pytest
from _eval_fixtures import CASES, RESPONSES, png, rows, write_parquet
from commands import eval_ as eval_main
from local_http import LocalJSONServer

from verl_mopd.clients import ClientError, OpenAIClient, RetryPolicy, run_bounded, to_openai
from verl_mopd.eval.messages import expand_images
from verl_mopd.eval.offline import evaluate, format_table, load_samples, metrics, read_results, score_sample
from verl_mopd.rewards import compute_score

FAST = RetryPolicy(max_retries=3, base_delay=0.01, max_delay=0.02)


# ----------------------------------------------------------------------------- a local OpenAI server


class _Server(LocalJSONServer):
    """A tiny OpenAI-compatible /v1/chat/completions server on 127.0.0.1 (stdlib, in a thread).

    It answers with the recorded response of the sample whose id ("[d0]") is in the user text,
    fails the first ``fail_first`` requests of every id with 503, answers ``status_for[id]``
    with that status, and records the bodies and the peak number of requests in flight.
    """

    def __init__(self, fail_first=0, status_for=None, delay=0.0, reasoning_split=False):
        super().__init__()
        self.fail_first, self.status_for, self.delay = fail_first, dict(status_for or {}), delay
        self.reasoning_split = reasoning_split
        self.seen = {}

    def respond(self, body, headers):
        time.sleep(self.delay)
        text = "".join(p.get("text", "") for p in body["messages"][-1]["content"] if p["type"] == "text")
        sid = re.search(r"\[(\w+)\]", text).group(1)
        with self.lock:
            n = self.seen[sid] = self.seen.get(sid, 0) + 1
        if sid in self.status_for:
            return self.status_for[sid], {"error": {"message": f"no {sid}"}}, None
        if n <= self.fail_first:
            return 503, {"error": {"message": "overloaded"}}, {"Retry-After": "0"}
        content = RESPONSES[sid]
        msg = {"role": "assistant", "content": content}
        if self.reasoning_split and "</think>" in content:
            thought, rest = content.split("</think>", 1)
            msg = {"role": "assistant", "content": rest, "reasoning_content": thought}
        return 200, {"choices": [{"index": 0, "message": msg, "finish_reason": "stop"}]}, None


# ----------------------------------------------------------------------------- messages


def test_images_fill_placeholders_in_order_and_reach_the_server_as_data_urls(tmp_path):
    shot_a, shot_b = png(8, 4), png(4, 8, (1, 2, 3))
    prompt = [{"role": "system", "content": "sys"}, {"role": "user", "content": "a <image> b <image>"}]
    (tmp_path / "b.png").write_bytes(shot_b)
    msgs = expand_images(prompt, [{"bytes": shot_a}, {"path": str(tmp_path / "b.png")}])
    assert msgs[0] == {"role": "system", "content": "sys"}
    assert [p["type"] for p in msgs[1]["content"]] == ["text", "image", "text", "image"]
    assert msgs[1]["content"][1]["image"] == shot_a and msgs[1]["content"][3]["image"] == shot_b
    oa = to_openai(msgs)[1]["content"]
    url = oa[1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,") and base64.b64decode(url.split(",", 1)[1]) == shot_a
    with pytest.raises(ValueError, match="2 images but 1 <image>"):
        expand_images([{"role": "user", "content": "<image>"}], [{"bytes": shot_a}, {"bytes": shot_b}])
    with pytest.raises(ValueError, match="more <image> placeholders"):
        expand_images([{"role": "user", "content": "<image><image>"}], [{"bytes": shot_a}])
    with pytest.raises(ValueError, match="'bytes' or 'path'"):
        expand_images([{"role": "user", "content": "<image>"}], [{"url": "x"}])


def test_load_samples_reads_ids_platforms_and_rejects_duplicates(tmp_path):
    path = write_parquet(tmp_path / "s.parquet", rows(image_format="path", tmp_path=tmp_path))
    samples = load_samples(path)
    assert [s.id for s in samples] == [c[0] for c in CASES]
    assert [s.platform for s in samples] == [c[1] for c in CASES]
    assert len(load_samples(path, platforms=["mobile"])) == sum(c[1] == "mobile" for c in CASES)
    assert len(load_samples(path, limit=2)) == 2
    dup = rows()[:2]
    dup[1]["extra_info"] = {**dup[1]["extra_info"], "step_id": dup[0]["extra_info"]["step_id"]}
    with pytest.raises(ValueError, match="duplicate sample ids"):
        load_samples(write_parquet(tmp_path / "dup.parquet", dup))


# ----------------------------------------------------------------------------- scoring and metrics


def test_recorded_responses_score_exactly_as_the_reward_and_metrics_follow():
    from verl_mopd.eval.offline import sample_from_row

    records = []
    for i, (row, case) in enumerate(zip(rows(), CASES)):
        s = sample_from_row(row, i)
        rec = score_sample(s, case[4])
        reward = compute_score(row["data_source"], case[4], row["reward_model"]["ground_truth"], row["extra_info"])
        assert rec["score"] == reward["score"] and rec["acc"] == reward["acc"] and rec["reason"] == reward["reason"]
        assert (rec["score"], rec["parsed"], rec["action_match"], rec["grounding"]) == tuple(case[5:]), case[0]
        records.append(rec)
    m = metrics(records)
    assert list(m) == ["desktop", "mobile", "all"]
    d, mo, a = m["desktop"], m["mobile"], m["all"]
    # desktop: d0 ok, d1 wrong point, d2 wrong type, d3 ok, d4 unparseable
    assert d["n"] == 5 and d["parse_rate"] == 4 / 5 and d["action_type_acc"] == 3 / 5 and d["step_success"] == 2 / 5
    assert d["grounding_acc"] == 2 / 3 and d["n_grounding"] == 3
    assert d["reward_hist"] == {"+1": 2, "-0.5": 2, "-1": 1} and d["mean_score"] == pytest.approx((2 - 1 - 1) / 5)
    # mobile: m0 ok, m1 wrong tool, m2 ok swipe, m3 wrong button
    assert mo["parse_rate"] == 3 / 4 and mo["action_type_acc"] == 3 / 4 and mo["step_success"] == 2 / 4
    assert mo["grounding_acc"] == 2 / 3 and mo["reward_hist"] == {"+1": 2, "-0.5": 1, "-1": 1}
    assert a["n"] == 9 and a["step_success"] == 4 / 9 and a["grounding_acc"] == 4 / 6
    table = format_table(m)
    assert table.splitlines()[0].startswith("| platform") and "| all " in table and "40.0%" in table


# ----------------------------------------------------------------------------- HTTP client


def test_http_client_retries_503_with_backoff_and_fails_fast_on_400():
    with _Server(fail_first=2, status_for={"d1": 400}) as srv:
        client = OpenAIClient(srv.url, "student", retry=FAST)
        msgs = [{"role": "user", "content": [{"type": "text", "text": "[d0] go"}, {"type": "image", "image": png(4, 4)}]}]
        assert client.complete(msgs) == RESPONSES["d0"]
        assert srv.seen["d0"] == 3  # two 503s, then the answer
        body = srv.bodies[-1]
        assert body["model"] == "student" and body["temperature"] == 0.0 and body["max_tokens"] == 2048
        assert body["messages"][0]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
        with pytest.raises(ClientError) as e:
            client.complete([{"role": "user", "content": [{"type": "text", "text": "[d1]"}]}])
        assert e.value.status == 400 and e.value.attempts == 1 and srv.seen["d1"] == 1
    with _Server(fail_first=10) as srv:
        with pytest.raises(ClientError, match="gave up after 4 attempts"):
            OpenAIClient(srv.url, "m", retry=FAST).complete([{"role": "user", "content": [{"type": "text", "text": "[d0]"}]}])
        assert srv.seen["d0"] == 4


def test_http_client_puts_a_split_off_reasoning_back_before_the_call():
    with _Server(reasoning_split=True) as srv:
        out = OpenAIClient(srv.url, "m", retry=FAST).complete([{"role": "user", "content": [{"type": "text", "text": "[d0]"}]}])
    assert out == RESPONSES["d0"]


def test_run_bounded_never_exceeds_its_bound_and_yields_every_item():
    lock, state = threading.Lock(), {"now": 0, "peak": 0}

    def fn(i):
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        time.sleep(0.01)
        with lock:
            state["now"] -= 1
        if i == 7:
            raise KeyError(i)
        return i * i

    out = {item: (res, err) for item, res, err in run_bounded(fn, iter(range(20)), max_in_flight=3)}
    assert set(out) == set(range(20)) and state["peak"] <= 3
    assert out[4] == (16, None) and isinstance(out[7][1], KeyError)
    with pytest.raises(ValueError, match="max_in_flight"):
        list(run_bounded(fn, [1], 0))


def test_offline_end_to_end_over_http_bounded_resumable(tmp_path, capsys):
    data = write_parquet(tmp_path / "steps.parquet", rows())
    out = tmp_path / "run"
    # first run: d3 and m2 fail for good (HTTP 400); everything else is retried through 503s
    with _Server(fail_first=1, status_for={"d3": 400, "m2": 400}, delay=0.02) as srv:
        rc = eval_main(["offline", "--data", data, "--out", str(out), "--base-url", srv.url, "--model", "m",
                        "--max-in-flight", "3", "--max-retries", "2", "--no-progress"])
        assert srv.peak <= 3 and srv.peak >= 2
        assert rc == 1
        first = json.loads((out / "report.json").read_text())
        assert first["counts"] == {"samples": 9, "scored": 7, "resumed": 0, "failed": 2, "stale_results_ignored": 0}
        assert sorted(f["id"] for f in first["failures"]) == ["d3", "m2"]
        assert set(read_results(str(out / "results.jsonl"))) == {c[0] for c in CASES} - {"d3", "m2"}
        # second run, the server healthy again: only the two missing ids are requested
        srv.fail_first, srv.status_for, srv.seen = 0, {}, {}
        rc = eval_main(["offline", "--data", data, "--out", str(out), "--base-url", srv.url, "--model", "m",
                        "--max-retries", "0", "--no-progress"])
        assert sorted(srv.seen) == ["d3", "m2"]
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert report["counts"]["resumed"] == 7 and report["counts"]["scored"] == 9 and report["counts"]["failed"] == 0
    assert report["metrics"]["all"]["step_success"] == 4 / 9
    assert report["metrics"]["desktop"]["reward_hist"] == {"+1": 2, "-0.5": 2, "-1": 1}
    assert "| desktop" in capsys.readouterr().out


def test_a_torn_last_line_is_skipped_and_a_broken_middle_line_is_an_error(tmp_path):
    p = tmp_path / "results.jsonl"
    p.write_text('{"id": "a", "x": 1}\n{"id": "b", "x"')
    assert set(read_results(str(p))) == {"a"}
    p.write_text('{"id": "a"\n{"id": "b"}\n')
    with pytest.raises(ValueError, match="results.jsonl:1"):
        read_results(str(p))


# ----------------------------------------------------------------------------- local transformers model


def _tiny_chat_model(path):
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

    words = ["<unk>", "<pad>", "<eos>", "<tool_call>", "</tool_call>", "</think>", "{", "}", '"name"', ":",
             '"computer_use"', '"mobile_use"', "[", "]", ",", "click", "left_click", "500", "Task", "do"]
    words += [f"w{i}" for i in range(64 - len(words))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")
    fast.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<assistant> {% endif %}"
    )
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=4096, eos_token_id=2, pad_token_id=1)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    fast.save_pretrained(path)
    return str(path)


def test_offline_end_to_end_on_a_tiny_random_transformers_model(tmp_path, capsys):
    model = _tiny_chat_model(tmp_path / "tiny")
    data = write_parquet(tmp_path / "steps.parquet", rows())
    rc = eval_main(["offline", "--data", data, "--out", str(tmp_path / "run"), "--hf-model", model,
                    "--max-tokens", "6", "--no-progress"])
    assert rc == 0
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    m = report["metrics"]["all"]
    # random weights: nothing parses, every step is the invalid level, grounding counts as missed
    assert m["n"] == 9 and m["parse_rate"] == 0.0 and m["step_success"] == 0.0 and m["reward_hist"] == {"-1": 9}
    assert m["grounding_acc"] == 0.0 and m["n_grounding"] == 6
    recs = read_results(str(tmp_path / "run" / "results.jsonl"))
    assert all(r["reason"].startswith("invalid:") and isinstance(r["response"], str) for r in recs.values())
    assert "images were dropped" in capsys.readouterr().err


def test_transformers_client_output_goes_through_the_same_scoring_path(tmp_path):
    """The model's text is scored as is: the tiny model's own greedy output, and a recorded good answer."""
    from verl_mopd.clients import TransformersClient
    from verl_mopd.eval.offline import load_samples

    client = TransformersClient(_tiny_chat_model(tmp_path / "tiny"), max_new_tokens=4)
    samples = load_samples(write_parquet(tmp_path / "s.parquet", rows()))
    greedy = client.complete(samples[0].messages)
    assert greedy == client.complete(samples[0].messages)  # deterministic
    good = {s.id: RESPONSES[s.id] for s in samples}
    report = evaluate(samples, lambda msgs: good[re.search(r"\[(\w+)\]", msgs[1]["content"][0]["text"]).group(1)],
                      str(tmp_path / "rec"), progress=False)
    assert report["metrics"]["all"]["step_success"] == 4 / 9
    assert score_sample(samples[0], greedy)["score"] == -1.0

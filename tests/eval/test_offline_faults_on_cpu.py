"""eval offline under faults: a misbehaving server, a torn or foreign results file, hostile image paths."""

import fcntl
import json
import os
import types

import pytest
from _eval_fixtures import CASES, RESPONSES, png, rows, write_parquet
from local_http import RawServer, http_response

from verl_mopd.errors import UsageError
from verl_mopd import clients
from commands import eval_ as eval_main
from verl_mopd.clients import ClientError, OpenAIClient, RetryPolicy
from verl_mopd.eval.offline import evaluate, load_samples, read_results

QUICK = RetryPolicy(max_retries=3, base_delay=0.01, max_delay=0.05, jitter=0.0)
MSGS = [{"role": "user", "content": [{"type": "text", "text": "[d0] go"}]}]


def _answer(content: str) -> bytes:
    body = '{"choices": [{"index": 0, "message": {"role": "assistant", "content": %s}}]}' % content
    return http_response("HTTP/1.1 200 OK", body.encode())


GOOD = _answer('"</think><tool_call>{\\"name\\": \\"mobile_use\\"}</tool_call>"')


@pytest.mark.parametrize(
    "fault",
    [
        http_response("HTTP/1.1 200 OK", b'{"choices": [{"mess', length=5000),  # connection dropped mid-body
        b"GARBAGE\r\n\r\n",  # a bad status line
        http_response("HTTP/1.1 200 OK", b"<html><body>502 Bad Gateway</body></html>"),  # a proxy's page
        http_response("HTTP/1.1 503 Service Unavailable", b"{}", length=900),  # a 503 whose body is cut short
    ],
    ids=["incomplete_read", "bad_status_line", "html_body", "cut_error_body"],
)
def test_transient_faults_are_retried(fault):
    with RawServer([fault, GOOD]) as srv:
        out = OpenAIClient(srv.url, "m", retry=QUICK).complete(MSGS)
    assert out == '</think><tool_call>{"name": "mobile_use"}</tool_call>' and srv.requests == 2


def test_retry_after_is_capped_at_the_policys_max_delay(monkeypatch):
    slept = []
    monkeypatch.setattr(clients, "time", types.SimpleNamespace(sleep=slept.append))
    busy = http_response("HTTP/1.1 429 Too Many Requests", b"{}", headers=["Retry-After: 3600"])
    with RawServer([busy, busy, GOOD]) as srv:
        OpenAIClient(srv.url, "m", retry=QUICK).complete(MSGS)
    assert len(slept) == 2 and max(slept) == QUICK.max_delay
    with RawServer([busy]) as srv:  # a server that is always busy: given up after the retries, no long sleep
        with pytest.raises(ClientError, match="gave up after 4 attempts: HTTP 429"):
            OpenAIClient(srv.url, "m", retry=QUICK).complete(MSGS)
    assert max(slept) == QUICK.max_delay


def test_a_json_answer_without_a_message_fails_at_once():
    with RawServer([http_response("HTTP/1.1 200 OK", b'{"choices": []}'), GOOD]) as srv:
        with pytest.raises(ClientError, match="bad response"):
            OpenAIClient(srv.url, "m", retry=QUICK).complete(MSGS)
    assert srv.requests == 1


def test_a_lone_surrogate_in_a_response_is_recorded_and_the_report_written(tmp_path):
    samples = load_samples(write_parquet(tmp_path / "s.parquet", rows(CASES[:3])))
    with RawServer([_answer('"I think \\ud800 so.</think>no call"')]) as srv:
        client = OpenAIClient(srv.url, "m", retry=QUICK)
        report = evaluate(samples, client.complete, str(tmp_path / "run"), progress=False)
    assert report["counts"]["scored"] == 3 and (tmp_path / "run" / "report.json").exists()
    recs = read_results(str(tmp_path / "run" / "results.jsonl"))
    assert recs["d0"]["response"] == "I think \ud800 so.</think>no call" and recs["d0"]["score"] == -1.0


# ----------------------------------------------------------------------------- resume


def _recorded(messages):
    import re

    return RESPONSES[re.search(r"\[(\w+)\]", messages[1]["content"][0]["text"]).group(1)]


def test_a_torn_last_line_is_cut_and_every_later_resume_works(tmp_path):
    samples = load_samples(write_parquet(tmp_path / "s.parquet", rows()))
    out = tmp_path / "run"
    evaluate(samples[:5], _recorded, str(out), progress=False, run={"model": "a"})
    results = out / "results.jsonl"
    text = results.read_text()
    torn = json.loads(text.splitlines()[-1])["id"]  # records are written as requests finish
    results.write_text(text[: len(text) - len(text.splitlines()[-1]) // 2 - 1])  # a crash mid-write
    asked = []

    def complete(messages):
        asked.append(messages[1]["content"][0]["text"][14:16])
        return _recorded(messages)

    for _ in range(2):  # the first resume repairs the tail; the second must read it cleanly
        report = evaluate(samples, complete, str(out), progress=False, run={"model": "a"})
        assert report["counts"]["scored"] == 9 and report["counts"]["failed"] == 0
    assert sorted(asked) == sorted([torn, "m0", "m1", "m2", "m3"])
    lines = results.read_text().splitlines()
    assert len(lines) == 9 and sorted(json.loads(line)["id"] for line in lines) == sorted(c[0] for c in CASES)
    assert report["metrics"]["all"]["step_success"] == 4 / 9


@pytest.mark.parametrize(
    "second, differs",
    [
        (["--model", "other"], "model 'first' (now 'other')"),
        (["--model", "first", "--mode", "ui_mopd"], "mode 'strict' (now 'ui_mopd')"),
        (["--model", "first", "--temperature", "0.7"], "temperature 0.0 (now 0.7)"),
        (["--model", "first", "--preset", "aitw"], "reward_kwargs {} (now {'preset': 'aitw'})"),
    ],
)
def test_a_resume_into_another_runs_results_is_refused(tmp_path, capsys, second, differs):
    from test_offline_on_cpu import _Server

    data = write_parquet(tmp_path / "s.parquet", rows(CASES[:2]))
    out = str(tmp_path / "run")
    with _Server() as srv:
        base = ["offline", "--data", data, "--out", out, "--base-url", srv.url, "--no-progress"]
        assert eval_main([*base, "--model", "first"]) == 0
        before = open(os.path.join(out, "results.jsonl")).read()
        assert eval_main([*base, *second]) == 2
        err = capsys.readouterr().err
        assert "holds results of another run" in err and differs in err and err.count("\n") == 1
        assert open(os.path.join(out, "results.jsonl")).read() == before
        assert eval_main([*base, "--model", "first"]) == 0  # the same run resumes


def test_results_without_run_json_are_not_adopted(tmp_path):
    samples = load_samples(write_parquet(tmp_path / "s.parquet", rows(CASES[:2])))
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.jsonl").write_text(json.dumps({"id": "d0", "platform": "desktop", "score": 1.0}) + "\n")
    with pytest.raises(UsageError, match="run.json is missing or unreadable"):
        evaluate(samples, _recorded, str(out), progress=False, run={"model": "a"})
    (out / "results.jsonl").unlink()  # as the message advises: a fresh start under the new key
    assert evaluate(samples, _recorded, str(out), progress=False, run={"model": "a"})["counts"]["scored"] == 2


def test_one_writer_per_out_folder(tmp_path):
    samples = load_samples(write_parquet(tmp_path / "s.parquet", rows(CASES[:2])))
    out = tmp_path / "run"
    out.mkdir()
    with open(out / "results.jsonl", "a") as other:
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(UsageError, match="another evaluation is writing"):
            evaluate(samples, _recorded, str(out), progress=False)


# ----------------------------------------------------------------------------- image paths


def _one_row(tmp_path, image):
    row = rows(CASES[:1])[0]
    row["images"] = [image]
    return write_parquet(tmp_path / "data" / "s.parquet", [row])


@pytest.fixture
def layout(tmp_path):
    (tmp_path / "data" / "shots").mkdir(parents=True)
    (tmp_path / "data" / "shots" / "a.png").write_bytes(png(8, 8))
    (tmp_path / "data" / "notes.png").write_text("not an image, despite the name")
    (tmp_path / "secret.txt").write_text("root:x:0:0")
    (tmp_path / "outside.png").write_bytes(png(4, 4))
    (tmp_path / "data" / "link.png").symlink_to(tmp_path / "outside.png")
    return tmp_path


@pytest.mark.parametrize(
    "image, error",
    [
        ({"image": "shots/a.png"}, None),  # relative to the data file's folder
        ("shots/a.png", None),
        ({"path": "file://{root}/data/shots/a.png"}, None),
        ({"image": "/etc/passwd"}, "outside the data root"),
        ({"image": "../secret.txt"}, "outside the data root"),
        ({"path": "shots/../../outside.png"}, "outside the data root"),
        ({"image": "link.png"}, "outside the data root"),  # a symlink out of the root
        ({"image": "notes.png"}, "not an image"),
        ({"bytes": b"#!/bin/sh\necho hi\n"}, "not an image"),
        ({"image": "shots/missing.png"}, "no such image file"),
    ],
)
def test_only_real_images_below_the_data_folder_are_sent(layout, image, error):
    if isinstance(image, dict):
        image = {k: v.format(root=layout) if isinstance(v, str) else v for k, v in image.items()}
    data = _one_row(layout, image)
    if error is None:
        (sample,) = load_samples(data)
        assert sample.messages[1]["content"][-1]["image"] == png(8, 8)
    else:
        with pytest.raises(UsageError, match=error) as e:
            load_samples(data)
        assert "s.parquet: row 0 (id='d0'): images[0]" in str(e.value)


def test_an_image_root_widens_the_folder_but_still_needs_an_image(layout, capsys):
    data = _one_row(layout, {"image": "../outside.png"})
    (sample,) = load_samples(data, image_root=str(layout))
    assert sample.messages[1]["content"][-1]["image"] == png(4, 4)
    data = _one_row(layout, {"image": str(layout / "secret.txt")})
    rc = eval_main(["offline", "--data", data, "--out", str(layout / "run"), "--base-url", "http://127.0.0.1:9/v1",
                    "--model", "m", "--image-root", str(layout), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "images[0]" in err and "not an image" in err and not (layout / "run").exists()

"""The subtask judge against a real OpenAI-compatible HTTP server started on 127.0.0.1 in the test."""

from __future__ import annotations

import pytest
from _data_helpers import record
from local_http import LocalJSONServer, RawServer, http_response

from verl_mopd.data.clean import CleanConfig, clean
from verl_mopd.data.judges import (
    JudgeConfig,
    JudgeError,
    OfflineJudge,
    OpenAIJudge,
    Verdict,
    parse_verdict_text,
)
from verl_mopd.data.schema import trajectory_from_dict


class _Server(LocalJSONServer):
    """A chat-completions endpoint answering from ``answers[instruction]`` and logging every request."""

    def __init__(self, answers, fail_first=0, status=200):
        super().__init__()
        self.answers, self.requests, self.fail_first, self.status = answers, [], fail_first, status

    def respond(self, body, headers):
        self.requests.append({"path": self.path, "body": body, "auth": headers.get("Authorization")})
        if self.fail_first > 0:
            self.fail_first -= 1
            return 500, {"error": "overloaded"}, None
        if self.status != 200:
            return self.status, {"error": "bad request"}, None
        text = body["messages"][0]["content"][0]["text"]
        instr = text.split("Task instruction: ", 1)[1].split("\n", 1)[0]
        return 200, {"choices": [{"message": {"role": "assistant", "content": self.answers[instr]}}]}, None


def _trajs(tmp):
    done = trajectory_from_dict(record(tmp, "done", judge=None, subtasks=["open", "save"]))
    half = trajectory_from_dict(record(tmp, "half", judge=None))
    return [done, half]


ANSWERS = {
    "do done": '<think>checking</think>```json\n{"subtasks": [{"subtask": "open", "completed": true},'
    ' {"subtask": "save", "score": 85}]}\n```',
    "do half": '{"subtasks": [{"subtask": "open", "completed": true}, {"subtask": "save", "score": 40}]}',
}


def test_openai_judge_drops_incomplete_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("JUDGE_TOKEN", "sekret")
    trajs = _trajs(str(tmp_path))
    with _Server(ANSWERS) as srv:
        cfg = JudgeConfig(srv.url, "judge-vlm", api_key_env="JUDGE_TOKEN", cache_dir=str(tmp_path / "cache"), max_images=1, workers=2)
        judge = OpenAIJudge(cfg)
        kept, drops = clean(trajs, CleanConfig(), judge=judge)
        assert [t.id for t in kept] == ["done"] and [(d.id, d.rule) for d in drops] == [("half", "subtasks")]
        assert "save" in drops[0].detail
        assert kept[0].judge["subtasks"][1] == {"subtask": "save", "completed": True, "score": 85.0}
        assert kept[0].judge["model"] == "judge-vlm"
        assert len(srv.requests) == 2 and judge.stats["requests"] == 2
        req = srv.requests[0]
        assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sekret"
        assert req["body"]["model"] == "judge-vlm"
        content = [r for r in srv.requests if "do done" in r["body"]["messages"][0]["content"][0]["text"]][0]["body"]
        parts = content["messages"][0]["content"]
        assert "1. open\n2. save" in parts[0]["text"]  # the given decomposition is sent
        assert [p["type"] for p in parts] == ["text", "image_url"] and parts[1]["image_url"]["url"].startswith("data:image/png;base64,")

        again = OpenAIJudge(cfg)  # a resumed run: everything from the cache, no request
        kept2, _ = clean(trajs, CleanConfig(), judge=again)
        assert len(srv.requests) == 2
        assert again.stats | {"cache_corrupt_files": None} == {
            "requests": 0, "cache_hits": 2, "reused": 0, "unreadable": 0, "cache_corrupt": 0, "cache_corrupt_files": None
        }  # fmt: skip
        assert [t.id for t in kept2] == ["done"]


def test_openai_judge_retries_server_errors_and_fails_loudly(tmp_path, monkeypatch):
    import verl_mopd.clients as clients

    sleeps = []
    monkeypatch.setattr(clients.time, "sleep", sleeps.append)  # the backoff, not the client, is replaced
    trajs = _trajs(str(tmp_path))[:1]
    with _Server(ANSWERS, fail_first=2) as srv:
        (v,) = OpenAIJudge(JudgeConfig(srv.url, "m", max_retries=2, max_images=0)).verdicts(trajs)
        assert v.all_completed and len(srv.requests) == 3 and sleeps == [1, 2]
    with _Server(ANSWERS, status=400) as srv:
        with pytest.raises(JudgeError, match="HTTP 400"):
            OpenAIJudge(JudgeConfig(srv.url, "m", max_retries=3, max_images=0)).verdicts(trajs)
        assert len(srv.requests) == 1  # client errors are not retried
    with _Server(ANSWERS, status=503) as srv:  # a server that never recovers stops the run, naming it
        with pytest.raises(JudgeError, match=r"HTTP 503"):
            OpenAIJudge(JudgeConfig(srv.url, "m", max_retries=1, max_images=0)).verdicts(trajs)
        assert len(srv.requests) == 2


@pytest.mark.parametrize(
    "fault",
    [
        http_response("HTTP/1.1 200 OK", b'{"choices": [{"mess', length=4000),  # connection dropped mid-body
        b"NOT HTTP\r\n\r\n",  # a garbled status line
        http_response("HTTP/1.1 502 Bad Gateway", b"<html>proxy</html>"),  # a proxy's error page
    ],
    ids=["incomplete_read", "bad_status_line", "proxy_502"],
)
def test_a_dropped_or_garbled_answer_is_retried_not_a_traceback(tmp_path, monkeypatch, fault):
    import json

    import verl_mopd.clients as clients

    monkeypatch.setattr(clients.time, "sleep", lambda s: None)
    (t,) = _trajs(str(tmp_path))[:1]
    content = json.dumps(ANSWERS["do done"])
    good = http_response("HTTP/1.1 200 OK", ('{"choices": [{"message": {"content": %s}}]}' % content).encode())
    with RawServer([fault, good]) as srv:
        (v,) = OpenAIJudge(JudgeConfig(srv.url, "m", max_retries=2, max_images=0)).verdicts([t])
        assert v.all_completed and srv.requests == 2
    with RawServer([fault]) as srv:  # never recovers: the run stops with a JudgeError naming it
        with pytest.raises(JudgeError, match="gave up after 2 attempts"):
            OpenAIJudge(JudgeConfig(srv.url, "m", max_retries=1, max_images=0)).verdicts([t])


def test_offline_judge_and_verdict_parsing(tmp_path):
    t = trajectory_from_dict(record(str(tmp_path), judge={"subtasks": [{"subtask": "a", "score": 69.9}]}))
    (v,) = OfflineJudge().verdicts([t])
    assert not v.all_completed
    assert OfflineJudge(threshold=60).verdict(t).all_completed
    assert Verdict.from_dict({"subtasks": []}).all_completed is False
    with pytest.raises(ValueError, match=r"subtasks\[0\]: needs 'completed'"):
        Verdict.from_dict({"subtasks": [{"subtask": "a"}]})
    assert parse_verdict_text('{"subtasks": [{"name": "x", "completed": false}]}').subtasks[0].subtask == "x"
    with pytest.raises(ValueError, match="base_url"):
        JudgeConfig("localhost:8000", "m")


# --------------------------------------------------------------------------- bad answers, ignored subtasks, bad cache


def _jsonl(tmp, records):
    from _data_helpers import relative, write_lines

    return write_lines(str(tmp / "t.jsonl"), [relative(r, str(tmp)) for r in records])


def _prepare(src, out, url, *extra):
    from commands import prepare as prepare_main

    return prepare_main(["--input", src, "--out", str(out), "--judge-base-url", url, "--judge-model", "jm",
                         "--val-fraction", "0", "--no-progress", "--workers", "2", *extra])  # fmt: skip


def _dropped(out):
    import json

    return {d["id"]: d for d in map(json.loads, open(out / "dropped.jsonl"))}


GOOD_ANSWER = '{"subtasks": [{"subtask": "a", "completed": true}]}'


def test_unreadable_answers_are_counted_drops_not_an_abort(tmp_path):
    import json

    answers = {"do prose": "Looks good to me!", "do yes": '{"subtasks": [{"subtask": "a", "completed": "yes"}]}',
               "do list": '[{"subtask": "a"}]', "do fine": GOOD_ANSWER}  # fmt: skip
    src = _jsonl(tmp_path, [record(str(tmp_path), tid=k.split()[1], judge=None) for k in answers])
    out = tmp_path / "out"
    with _Server(answers) as srv:
        assert _prepare(src, out, srv.url) == 0
        assert len(srv.requests) == 4
        dropped = _dropped(out)
        assert {k: (d["rule"], d["kind"]) for k, d in dropped.items()} == {
            k: ("subtasks", "unreadable") for k in ("prose", "yes", "list")}  # fmt: skip
        assert "no JSON object" in dropped["prose"]["detail"] and "needs 'completed'" in dropped["yes"]["detail"]
        report = json.load(open(out / "report.json"))
        assert report["judge"]["unreadable"] == 3 and report["kinds"]["subtasks"] == {"unreadable": 3}
        assert [t["id"] for t in map(json.loads, open(out / "cleaned.jsonl"))] == ["fine"]
        assert _prepare(src, out, srv.url, "--overwrite") == 0
        assert len(srv.requests) == 7  # unreadable answers are not cached: asked again; the good one is


def test_a_verdict_that_ignores_the_listed_subtasks_is_refused(tmp_path):
    listed = ["Open the file", "save it"]
    answers = {
        "do other": '{"subtasks": [{"subtask": "something else", "completed": true}]}',
        "do half": '{"subtasks": [{"subtask": "open the file", "completed": true}]}',
        "do reworded": '{"subtasks": [{"subtask": "1. Open  the FILE.", "completed": true},'
        ' {"subtask": "2) save it", "score": 90}, {"subtask": "extra", "completed": true}]}',
    }
    src = _jsonl(tmp_path, [record(str(tmp_path), tid=k.split()[1], judge=None, subtasks=listed) for k in answers])
    out = tmp_path / "out"
    with _Server(answers) as srv:
        assert _prepare(src, out, srv.url) == 0
        assert "answer for each one, copying its text exactly" in srv.requests[0]["body"]["messages"][0]["content"][0]["text"]
    dropped = _dropped(out)
    assert {k: d["kind"] for k, d in dropped.items()} == {"other": "uncovered", "half": "uncovered"}
    assert dropped["half"]["detail"] == "the verdict leaves out listed subtasks ['save it']"
    # the same check applies to verdicts already in the data
    t = trajectory_from_dict(record(str(tmp_path), tid="off", subtasks=listed,
                                    judge={"subtasks": [{"subtask": "unrelated", "completed": True}]}))  # fmt: skip
    kept, drops = clean([t], CleanConfig())
    assert not kept and drops[0].kind == "uncovered"


def test_corrupt_cache_files_are_named_asked_again_and_rewritten(tmp_path, capsys):
    import json

    answers = {f"do c{i}": GOOD_ANSWER for i in range(5)}
    src = _jsonl(tmp_path, [record(str(tmp_path), tid=f"c{i}", judge=None) for i in range(5)])
    out = tmp_path / "out"
    with _Server(answers) as srv:
        assert _prepare(src, out, srv.url) == 0
        cache = sorted((out / "judge_cache").rglob("*.json"))  # kept in --out across runs
        assert len(cache) == 5 and len(srv.requests) == 5
        cache[0].write_text('{"trajectory": "c0", "answ')  # torn
        cache[1].write_text("")  # empty
        cache[2].write_text('{"trajectory": "c2"}')  # no answer
        cache[3].write_text('{"answer": "not a verdict"}')  # an answer that does not read
        capsys.readouterr()
        assert _prepare(src, out, srv.url, "--overwrite") == 0
        err = capsys.readouterr().err
        assert "4 judge cache file(s) were unreadable and asked again" in err
        for p in cache[:4]:
            assert str(p) in err
            json.load(open(p))  # rewritten whole
        assert len(srv.requests) == 9
        report = json.load(open(out / "report.json"))
        assert report["judge"]["cache_corrupt"] == 4 and report["judge"]["cache_hits"] == 1
        assert _prepare(src, out, srv.url, "--overwrite") == 0
        assert len(srv.requests) == 9  # all from the cache now


def test_offline_malformed_verdicts_are_counted_not_raised(tmp_path):
    bad = [{"subtasks": [{"subtask": "a", "completed": "yes"}]}, {"subtasks": "all done"}, {"verdict": True}]
    ts = [trajectory_from_dict(record(str(tmp_path), tid=f"b{i}", judge=j)) for i, j in enumerate(bad)]
    kept, drops = clean(ts, CleanConfig())
    assert not kept and [d.kind for d in drops] == ["unreadable"] * 3
    assert "b0" in drops[0].detail and "subtasks[0]" in drops[0].detail


def test_a_lone_surrogate_in_an_answer_is_cached_and_written_not_a_crash(tmp_path):
    import json

    # a server that cuts an emoji in half sends an escaped lone surrogate, which json.loads keeps
    answers = {"do s0": GOOD_ANSWER + " \ud83d", "do s1": "no verdict \udc00 here"}
    src = _jsonl(tmp_path, [record(str(tmp_path), tid=f"s{i}", judge=None) for i in range(2)])
    out = tmp_path / "out"
    with _Server(answers) as srv:
        assert _prepare(src, out, srv.url) == 0
        assert [t["id"] for t in map(json.loads, open(out / "cleaned.jsonl"))] == ["s0"]
        assert _dropped(out)["s1"]["kind"] == "unreadable"
        assert _prepare(src, out, srv.url, "--overwrite") == 0
        asked = ["do s0" in r["body"]["messages"][0]["content"][0]["text"] for r in srv.requests]
        assert asked.count(True) == 1  # s0's answer was read back from its cache file (s1's, unreadable, is re-asked)

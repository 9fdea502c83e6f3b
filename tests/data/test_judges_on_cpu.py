"""The subtask judge against a real OpenAI-compatible HTTP server started on 127.0.0.1 in the test."""

from __future__ import annotations

import pytest
from _data_helpers import record
from local_http import LocalJSONServer

from verl_mopd.data.judges import JudgeConfig, JudgeError, OfflineJudge, OpenAIJudge, Verdict, parse_verdict_text
from verl_mopd.data.trajectories import CleanConfig, clean, trajectory_from_dict


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
        assert len(srv.requests) == 2 and again.stats == {"requests": 0, "cache_hits": 2, "reused": 0}
        assert [t.id for t in kept2] == ["done"]


def test_openai_judge_retries_server_errors_and_fails_loudly(tmp_path, monkeypatch):
    import verl_mopd.data.judges as jm

    sleeps = []
    monkeypatch.setattr(jm.time, "sleep", sleeps.append)  # the backoff, not the client, is replaced
    trajs = _trajs(str(tmp_path))[:1]
    with _Server(ANSWERS, fail_first=2) as srv:
        (v,) = OpenAIJudge(JudgeConfig(srv.url, "m", max_retries=2, max_images=0)).verdicts(trajs)
        assert v.all_completed and len(srv.requests) == 3 and sleeps == [1, 2]
    with _Server(ANSWERS, status=400) as srv:
        with pytest.raises(JudgeError, match="HTTP 400"):
            OpenAIJudge(JudgeConfig(srv.url, "m", max_retries=3, max_images=0)).verdicts(trajs)
        assert len(srv.requests) == 1  # client errors are not retried
    with _Server({"do done": "I think it is fine."}) as srv:
        with pytest.raises(JudgeError, match="no JSON object"):
            OpenAIJudge(JudgeConfig(srv.url, "m", max_images=0)).verdicts(trajs)


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

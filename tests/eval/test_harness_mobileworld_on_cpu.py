"""The MobileWorld agent loaded and run the way ``mw eval --agent-type <file.py>`` does.

MobileWorld's pinned ``load_agent_from_file``/``create_agent`` load verl_mopd/eval/mobileworld.py
by file, its pinned runner loop drives the agent, every action goes through the JSON round trip
of the HTTP call into the pinned server ``step``, which drives a recording device. The model is an
OpenAI-compatible server on 127.0.0.1, called through MobileWorld's own ``BaseAgent`` client.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from _eval_fixtures import call

pytest.importorskip("openai", reason="MobileWorld's BaseAgent needs openai: pip install -e .[test]")
pytest.importorskip("loguru", reason="MobileWorld's BaseAgent needs loguru: pip install -e .[test]")

import verl_mopd.eval.mobileworld as ours  # noqa: E402

HARNESS = str(Path(__file__).with_name("harness"))
SCREEN = (1080, 2400)


@pytest.fixture
def mw(monkeypatch):
    """The pinned mobile_world package on the path, removed again afterwards."""
    monkeypatch.syspath_prepend(HARNESS)
    for name in [m for m in sys.modules if m == "mobile_world" or m.startswith("mobile_world.")]:
        monkeypatch.delitem(sys.modules, name)
    from mobile_world.agents import registry
    from mobile_world.core import runner, server
    from mobile_world.runtime.utils import models

    monkeypatch.setattr(server, "time", type("T", (), {"sleep": staticmethod(lambda s: None)}))
    yield registry, runner, server, models
    for name in [m for m in sys.modules if m == "mobile_world" or m.startswith("mobile_world.")]:
        sys.modules.pop(name, None)
    sys.modules.pop("mobileworld", None)  # the module load_agent_from_file registered


class Model(BaseHTTPRequestHandler):
    """``POST /v1/chat/completions``: the next recorded reply, with usage."""

    replies: list[str] = []
    requests: list[dict] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        text = type(self).replies[min(len(type(self).requests), len(type(self).replies)) - 1]
        out = json.dumps({
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107},
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a):
        pass


@pytest.fixture
def model_server():
    Model.replies, Model.requests = [], []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Model)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


class Device:
    """The adb side of the server's controller: records what reaches the phone."""

    def __init__(self, reply="7 am"):
        self.calls, self.reply = [], reply

    def __getattr__(self, name):
        if name in ("tap", "swipe", "text", "back", "home", "enter", "long_press", "double_tap", "drag",
                    "launch_app", "answer"):
            return lambda *a: self.calls.append((name, *a))
        raise AttributeError(name)

    def ask_user(self, question):
        self.calls.append(("ask_user", question))
        return self.reply


class Env:
    """MobileWorld's AndroidEnvClient as the runner uses it, with the HTTP call's JSON round trip."""

    def __init__(self, server, models, device, score=1.0):
        from PIL import Image

        self.server, self.models, self.device, self.score = server, models, device, score
        self.screen = Image.new("RGB", SCREEN)

    def obs(self, reply=None):
        return self.models.Observation(screenshot=self.screen, ask_user_response=reply)

    def get_task_goal(self, task_type):
        return f"goal of {task_type}"

    def initialize_task(self, task_name):
        return self.obs()

    def execute_action(self, action):
        wire = json.dumps({"device": "emulator-5554", "action": action.model_dump(exclude_none=True)})
        req = self.models.StepRequest.model_validate_json(wire)
        result = self.server.step(req, self.device)["result"]
        return self.obs(result if action.action_type == "ask_user" else None)

    def get_task_score(self, task_type):
        return self.score, "checker"

    def tear_down_task(self, task_type):
        return "ok"


class Traj:
    def __init__(self):
        self.steps, self.score = [], None

    def log_traj(self, task_name, goal, step, prediction, action, obs, usage):
        self.steps.append((prediction, action, usage))

    def log_score(self, score, reason):
        self.score = score


def run(mw, base_url, replies, max_step=50, monkeypatch=None, **agent_kw):
    registry, runner, server, models = mw
    Model.replies = replies
    agent = registry.create_agent(ours.__file__, "student", base_url, "empty", env=None,
                                  executor_llm_base_url=None, executor_model_name=None,
                                  executor_agent_class=None, scale_factor=1000, **agent_kw)
    device, traj = Device(), Traj()
    steps, score = runner._execute_single_task(Env(server, models, device), agent, "task", max_step, traj)
    return agent, device, traj, steps


def test_the_file_loads_as_one_baseagent_subclass(mw):
    registry = mw[0]
    cls = registry.load_agent_from_file(ours.__file__)
    assert cls.__name__ == "VerlMopdMobileWorldAgent" and issubclass(cls, sys.modules["mobile_world.agents.base"].BaseAgent)


def test_module_imports_without_mobile_world_torch_or_verl():
    import subprocess

    code = ("import sys, verl_mopd.eval.mobileworld as m, verl_mopd.eval.osworld; "
            "print(hasattr(m, 'VerlMopdMobileWorldAgent'), sorted({'torch', 'verl', 'numpy'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(ours.__file__).parents[2])
    assert out.stdout.split() == ["False", "[]"]  # so `pip install --no-deps` into MobileWorld's env suffices


M = lambda **a: call("mobile_use", **a)  # noqa: E731

EPISODE = [
    (M(action="click", coordinate=[500, 500]), ("tap", 540, 1200)),
    (M(action="long_press", coordinate=[100, 50], time=2), ("long_press", 108, 120, 1000)),
    (M(action="swipe", coordinate=[500, 800], coordinate2=[500, 200]), ("drag", 540, 1920, 540, 480)),
    (M(action="type", text="héllo 東京"), ("text", "héllo 東京")),
    (M(action="system_button", button="Back"), ("back",)),
    (M(action="system_button", button="home"), ("home",)),
    (M(action="system_button", button="Enter"), ("enter",)),
    (M(action="key", text="KEYCODE_BACK"), ("back",)),
    (M(action="open", text="Clock"), ("launch_app", "Clock")),
    (M(action="wait", time=1), None),
    (M(action="ask_user", text="Which alarm?"), ("ask_user", "Which alarm?")),
    (M(action="answer", text="7 pm"), ("answer", "7 pm")),
]


def test_every_mobile_action_reaches_the_device(mw, model_server):
    agent, device, traj, steps = run(mw, model_server, [r for r, _ in EPISODE])
    assert device.calls == [c for _, c in EPISODE if c is not None]
    assert steps == len(EPISODE) and traj.score == 1.0  # answer is executed, then the episode ends
    # the runner logs the real token counters of MobileWorld's own client
    assert traj.steps[-1][2] == {"completion_tokens": 7 * 12, "prompt_tokens": 100 * 12, "cached_tokens": 0,
                                 "total_tokens": 107 * 12}
    # the user's reply is in the next prompt, the system prompt offers ask_user
    texts = [r["messages"][1]["content"][0]["text"] for r in Model.requests]
    assert "the user answered: 7 am" in texts[11] and '"ask_user"' in Model.requests[0]["messages"][0]["content"]
    assert Model.requests[0]["model"] == "student" and Model.requests[0]["temperature"] == 0.0


def test_terminate_ends_the_episode_unexecuted(mw, model_server):
    _, device, traj, steps = run(mw, model_server, [M(action="click", coordinate=[1, 1]), M(action="terminate", status="success")])
    assert steps == 2 and device.calls == [("tap", 1, 2)] and traj.steps[-1][1] == {"action_type": "finished", "text": "success"}


@pytest.mark.parametrize("on_invalid,requests,taps", [
    ("retry", 3, [("tap", 0, 0)]),  # step 1: unparseable, re-asked: Menu (no MobileWorld action), waits
    ("wait", 2, []),  # step 1 waits, step 2 (Menu) waits
])
def test_invalid_reply_keeps_the_episode(mw, model_server, on_invalid, requests, taps, monkeypatch):
    monkeypatch.setenv("VERL_MOPD_ON_INVALID", on_invalid)
    replies = ["<think>cut at max_tokens", M(action="system_button", button="Menu"), M(action="click", coordinate=[0, 0])]
    _, device, traj, steps = run(mw, model_server, replies, max_step=2)
    assert traj.steps[0][1] == {"action_type": "wait"} and steps == 2
    assert len(Model.requests) == requests and device.calls == taps


def test_retry_recovers_within_the_step(mw, model_server):
    _, device, traj, _ = run(mw, model_server, ["garbage", M(action="click", coordinate=[500, 500])], max_step=1)
    assert device.calls == [("tap", 540, 1200)] and len(Model.requests) == 2
    assert "(invalid output)" in Model.requests[1]["messages"][1]["content"][0]["text"]


def test_on_invalid_end_ends_the_episode(mw, model_server):
    _, device, traj, steps = run(mw, model_server, ["garbage"], on_invalid="end")
    assert steps == 1 and traj.steps[0][1]["action_type"] == "unknown" and device.calls == []


def test_budget_and_harness_max_step(mw, model_server, monkeypatch):
    monkeypatch.setenv("VERL_MOPD_MAX_STEPS", "4")
    _, device, traj, steps = run(mw, model_server, [M(action="wait")], max_step=50)
    assert len(Model.requests) == 4 and steps == 5 and traj.steps[-1][1]["action_type"] == "finished"
    # MobileWorld without --max-step passes -1: the loop stops after ONE step
    Model.requests.clear()
    _, _, _, steps = run(mw, model_server, [M(action="wait")], max_step=-1)
    assert steps == 1 and len(Model.requests) == 1


def test_model_failure_ends_the_task_as_mobileworlds_agents_do(mw, monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: None)  # BaseAgent's retry pause
    _, device, traj, steps = run(mw, "http://127.0.0.1:9/v1", ["unused"])
    assert steps == 1 and traj.steps[0][0] is None and device.calls == []


def test_every_json_action_validates_in_mobileworlds_model(mw):
    models = mw[3]
    from verl_mopd.rewards import normalize_action

    for reply, _ in EPISODE:
        arguments = json.loads(reply.split("<tool_call>\n")[1].split("\n</tool_call>")[0])["arguments"]
        d = ours.to_json_action(normalize_action("mobile", arguments), *SCREEN)
        assert models.JSONAction(**d).model_dump(exclude_none=True) == d


def test_bad_environment_options_name_the_variable(mw, model_server, monkeypatch):
    monkeypatch.setenv("VERL_MOPD_MAX_STEPS", "thirty")
    with pytest.raises(ValueError, match="VERL_MOPD_MAX_STEPS='thirty'"):
        run(mw, model_server, [M(action="wait")])

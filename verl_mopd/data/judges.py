"""Subtask-decomposition judge: did the trajectory complete every subtask of its instruction?

UI-MOPD's last cleaning stage asks a VLM to decompose the instruction into subtasks and to judge
each one against the trajectory; a trajectory is kept only if every subtask is completed. Two
judges share one interface, ``verdicts(trajectories, progress=False) -> list[Verdict | None]``:

- :class:`OfflineJudge` reads verdicts already in the data (the trajectory's ``judge`` field),
  ``None`` where there is none.
- :class:`OpenAIJudge` asks any OpenAI-compatible ``/chat/completions`` server (SGLang, vLLM, a
  hosted API; ``base_url`` and ``model`` configurable) and caches every answer on disk, keyed by
  the SHA-256 of the request, so a rerun (or a resumed run) sends only the requests it lacks.

Verdict layout (what the judge must answer, and what is stored in the trajectory's ``judge``)::

    {"subtasks": [{"subtask": "open the terminal", "completed": true},
                  {"subtask": "create goast.out", "score": 40}],     # score 0-100 also accepted
     "model": "..."}

An item with ``score`` instead of ``completed`` counts as completed when ``score >= threshold``
(70, the public release's threshold). Requests go through :class:`verl_mopd.clients.OpenAIClient`
(standard library only), the client ``verl-mopd eval offline`` uses, with its retries.

A verdict that cannot be read (an answer with no JSON object, ``"completed": "yes"``, a malformed
``judge`` field in the data) is returned as :class:`UnreadableVerdict` and the ``subtasks`` rule
drops that trajectory (kind ``unreadable``) instead of stopping the run. When the trajectory lists
its ``subtasks``, a verdict must cover each of them by name (case, spacing, numbering and final
punctuation ignored), else it is refused (kind ``uncovered``). A cache file that is not a JSON
object with a string ``answer`` (torn, empty, edited), or whose answer no longer reads as a
verdict, is named in ``stats["cache_corrupt_files"]``, asked again, and overwritten.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from verl_mopd.data.images import identify, read_screenshot
from verl_mopd.data.schema import Step, Trajectory
from verl_mopd.errors import ConfigError
from verl_mopd.files import atomic_write, json_text

SCORE_THRESHOLD = 70.0


@dataclass(frozen=True)
class SubtaskVerdict:
    subtask: str
    completed: bool
    score: float | None = None


def _subtask_key(name: str) -> str:
    """A subtask name as compared: case, spacing, leading numbering and final punctuation ignored."""
    return re.sub(r"^\s*\d+[.)]\s*", "", " ".join(name.casefold().split())).rstrip(" .;:")


@dataclass(frozen=True)
class Verdict:
    """Per-subtask verdicts; the trajectory passes iff it lists subtasks and all are completed."""

    subtasks: tuple[SubtaskVerdict, ...]
    model: str = ""

    @property
    def all_completed(self) -> bool:
        return bool(self.subtasks) and all(s.completed for s in self.subtasks)

    def uncovered(self, listed: Iterable[str]) -> list[str]:
        """The ``listed`` subtasks this verdict says nothing about."""
        have = {_subtask_key(s.subtask) for s in self.subtasks}
        return [s for s in listed if _subtask_key(s) not in have]

    def to_dict(self) -> dict[str, Any]:
        items = []
        for s in self.subtasks:
            item: dict[str, Any] = {"subtask": s.subtask, "completed": s.completed}
            if s.score is not None:
                item["score"] = s.score
            items.append(item)
        out: dict[str, Any] = {"subtasks": items}
        if self.model:
            out["model"] = self.model
        return out

    @classmethod
    def from_dict(cls, d: Any, threshold: float = SCORE_THRESHOLD, where: str = "judge") -> "Verdict":
        """Read the layout above; raises ValueError naming the field."""
        if not isinstance(d, Mapping) or not isinstance(d.get("subtasks"), list):
            raise ValueError(f"{where}={str(d)[:200]!r}: expected {{'subtasks': [{{'subtask', 'completed'|'score'}}]}}")
        items = []
        for i, item in enumerate(d["subtasks"]):
            w = f"{where}.subtasks[{i}]"
            if not isinstance(item, Mapping):
                raise ValueError(f"{w}={item!r}: expected an object")
            name = item.get("subtask", item.get("name", ""))
            if not isinstance(name, str):
                raise ValueError(f"{w}.subtask={name!r}: expected a string")
            score = item.get("score")
            if isinstance(item.get("completed"), bool):
                completed = item["completed"]
            elif isinstance(score, (int, float)) and not isinstance(score, bool):
                completed = float(score) >= threshold
            else:
                raise ValueError(f"{w}: needs 'completed' (true/false) or a numeric 'score' (0-100)")
            items.append(SubtaskVerdict(name, completed, float(score) if isinstance(score, (int, float)) else None))
        return cls(tuple(items), str(d.get("model") or ""))


@dataclass(frozen=True)
class UnreadableVerdict:
    """A verdict that could not be read; ``reason`` says why (the ``subtasks`` rule drops it)."""

    reason: str


def _data_verdict(t: Trajectory, threshold: float) -> Verdict | UnreadableVerdict:
    try:
        return Verdict.from_dict(t.judge, threshold, where=f"trajectory {t.id!r}.judge")
    except ValueError as e:
        return UnreadableVerdict(str(e))


class OfflineJudge:
    """Verdicts already in the data (the trajectory's ``judge`` field)."""

    def __init__(self, threshold: float = SCORE_THRESHOLD):
        self.threshold = threshold

    def verdict(self, t: Trajectory) -> Verdict | UnreadableVerdict | None:
        return None if t.judge is None else _data_verdict(t, self.threshold)

    def verdicts(self, trajectories: Sequence[Trajectory], progress: bool = False) -> list:
        return [self.verdict(t) for t in trajectories]


@dataclass(frozen=True)
class JudgeConfig:
    """The OpenAI-compatible judge.

    Attributes:
        base_url: the server's OpenAI API root, e.g. ``http://127.0.0.1:30000/v1`` (SGLang).
        model: the ``model`` field of each request.
        api_key_env: environment variable holding the bearer token (unset: no Authorization).
        cache_dir: one JSON file per answered request; None disables the cache.
        max_images: the last this many screenshots go into the request (0: text only).
        threshold: score at or above which a scored subtask counts as completed.
        timeout_s, max_retries: per request; retries back off 1, 2, 4... seconds.
        workers: concurrent requests.
        temperature, max_tokens: sampling of the judge.
        reuse_verdicts: trust a verdict already in the data instead of asking again.
    """

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    cache_dir: str | None = None
    max_images: int = 3
    threshold: float = SCORE_THRESHOLD
    timeout_s: float = 120.0
    max_retries: int = 3
    workers: int = 4
    temperature: float = 0.0
    max_tokens: int = 2048
    reuse_verdicts: bool = True

    def __post_init__(self):
        errors = []
        if not isinstance(self.base_url, str) or not re.match(r"^https?://", self.base_url):
            errors.append(f"base_url={self.base_url!r}: must start with http:// or https://")
        if not isinstance(self.model, str) or not self.model:
            errors.append(f"model={self.model!r}: must be a non-empty string")
        for name in ("max_images", "max_retries"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                errors.append(f"{name}={v!r}: must be an integer >= 0")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            errors.append(f"workers={self.workers!r}: must be an integer >= 1")
        if not (isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0):
            errors.append(f"timeout_s={self.timeout_s!r}: must be > 0")
        if errors:
            raise ConfigError(errors, "judge config")


JUDGE_PROMPT = """You review a recorded GUI-agent trajectory ({platform}).

Task instruction: {instruction}

{subtask_block}

Actions taken, in order:
{actions}

{image_note}Decide for every subtask whether the trajectory completed it. Answer with exactly one JSON
object and nothing else:
{{"subtasks": [{{"subtask": "<subtask>", "completed": true or false}}, ...]}}"""


def _subtask_block(t: Trajectory) -> str:
    if t.subtasks:
        listed = "\n".join(f"{i}. {s}" for i, s in enumerate(t.subtasks, 1))
        return f"Subtasks to check (answer for each one, copying its text exactly):\n{listed}"
    return "First decompose the instruction into its subtasks (each a verifiable outcome)."


def _action_lines(t: Trajectory) -> str:
    lines = []
    for s in t.steps:
        what = s.description or json.dumps(dict(s.action), ensure_ascii=False)
        lines.append(f"Step {s.index}: {what}")
    return "\n".join(lines) or "(none)"


def _data_url(step: Step) -> str:
    """The step's screenshot as a data URL; only a checked image inside the data roots is sent."""
    data = read_screenshot(step)
    try:
        fmt, _ = identify(data)
    except ValueError as e:
        raise ValueError(f"step {step.index}: screenshot {step.screenshot!r} {e}; not sent to the judge") from None
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(data).decode("ascii")


def build_messages(t: Trajectory, max_images: int) -> list[dict[str, Any]]:
    """The chat request for one trajectory: the prompt text, then the last ``max_images`` screenshots."""
    shots = list(t.steps[-max_images:]) if max_images else []
    note = f"The last {len(shots)} screenshots of the trajectory follow, oldest first.\n\n" if shots else ""
    text = JUDGE_PROMPT.format(
        platform=t.platform,
        instruction=t.instruction,
        subtask_block=_subtask_block(t),
        actions=_action_lines(t),
        image_note=note,
    )
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    content += [{"type": "image_url", "image_url": {"url": _data_url(s)}} for s in shots]
    return [{"role": "user", "content": content}]


def parse_verdict_text(text: str, threshold: float = SCORE_THRESHOLD, model: str = "") -> Verdict:
    """The judge's answer -> :class:`Verdict`. Tolerates ``<think>`` blocks and ``` fences around the JSON."""
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    if fenced:
        text = fenced.group(1)
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ValueError(f"judge answer has no JSON object: {text[:200]!r}")
    try:
        obj = json.loads(text[start : end + 1])
    except ValueError as e:
        raise ValueError(f"judge answer is not valid JSON ({e}): {text[:200]!r}") from None
    if isinstance(obj, dict) and model and "model" not in obj:
        obj["model"] = model
    return Verdict.from_dict(obj, threshold, where="judge answer")


class JudgeError(RuntimeError):
    """The judge server failed (after retries) or answered something unreadable."""


@dataclass
class OpenAIJudge:
    """Judge through an OpenAI-compatible chat-completions endpoint, with an on-disk cache.

    ``stats``: ``requests`` sent, ``cache_hits``, ``reused`` (verdicts already in the data),
    ``unreadable`` answers or data verdicts, ``cache_corrupt`` files (named in
    ``cache_corrupt_files``, at most 20).
    """

    config: JudgeConfig
    stats: dict[str, Any] = field(
        default_factory=lambda: {"requests": 0, "cache_hits": 0, "reused": 0, "unreadable": 0, "cache_corrupt": 0,
                                 "cache_corrupt_files": []}  # fmt: skip
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def _count(self, key: str, path: str | None = None) -> None:
        with self._lock:
            self.stats[key] += 1
            if path is not None and len(self.stats["cache_corrupt_files"]) < 20:
                self.stats["cache_corrupt_files"].append(path)

    def _request_body(self, t: Trajectory) -> dict[str, Any]:
        c = self.config
        return {
            "model": c.model,
            "messages": build_messages(t, c.max_images),
            "temperature": c.temperature,
            "max_tokens": c.max_tokens,
            "stream": False,
        }

    def _cache_path(self, body: Mapping[str, Any]) -> str | None:
        if not self.config.cache_dir:
            return None
        key = hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()
        return os.path.join(self.config.cache_dir, key[:2], f"{key}.json")

    def _post(self, body: Mapping[str, Any]) -> str:
        """The answer text, through the eval client's transport and retries (dropped connections,
        bad status lines, non-JSON bodies, 429/5xx; backoff 1, 2, 4, ... s, at most 30 s)."""
        from verl_mopd.clients import ClientError, OpenAIClient, RetryPolicy

        c = self.config
        token = os.environ.get(c.api_key_env) if c.api_key_env else None
        retry = RetryPolicy(max_retries=c.max_retries, base_delay=1.0, max_delay=30.0, jitter=0.0)
        client = OpenAIClient(c.base_url, c.model, api_key=token or None, timeout=c.timeout_s, retry=retry)
        try:
            return client.post(body)
        except ClientError as e:
            raise JudgeError(f"judge request (model {c.model!r}) failed: {e}") from None

    def _cached(self, path: str) -> Verdict | None:
        """The cached verdict, or None (absent; or corrupt: counted, named, and asked again)."""
        if not os.path.isfile(path):
            return None
        try:
            with open(path, encoding="utf-8") as f:
                entry = json.load(f)
            if not isinstance(entry, dict) or not isinstance(entry.get("answer"), str):
                raise ValueError("expected a JSON object with a string 'answer'")
            verdict = parse_verdict_text(entry["answer"], self.config.threshold, self.config.model)
        except (OSError, ValueError) as e:
            self._count("cache_corrupt", f"{path}: {type(e).__name__}: {str(e)[:120]}")
            return None
        self._count("cache_hits")
        return verdict

    def _store(self, path: str, t: Trajectory, text: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with atomic_write(path) as f:
            f.write(json_text({"trajectory": t.id, "model": self.config.model, "answer": text}))

    def verdict(self, t: Trajectory) -> Verdict | UnreadableVerdict:
        c = self.config
        if c.reuse_verdicts and t.judge is not None:
            self._count("reused")
            v = _data_verdict(t, c.threshold)
            if isinstance(v, UnreadableVerdict):
                self._count("unreadable")
            return v
        body = self._request_body(t)
        path = self._cache_path(body)
        cached = self._cached(path) if path else None
        if cached is not None:
            return cached
        text = self._post(body)
        self._count("requests")
        try:
            verdict = parse_verdict_text(text, c.threshold, c.model)
        except ValueError as e:
            self._count("unreadable")
            return UnreadableVerdict(str(e))  # not cached: the next run asks again
        if path:
            self._store(path, t, text)
        return verdict

    def verdicts(self, trajectories: Sequence[Trajectory], progress: bool = False) -> list:
        with ThreadPoolExecutor(max_workers=self.config.workers) as pool:
            it = pool.map(self.verdict, trajectories)
            if progress:
                from tqdm import tqdm

                it = tqdm(it, total=len(trajectories), desc="judge", unit="traj")
            return list(it)


__all__ = [
    "JUDGE_PROMPT",
    "SCORE_THRESHOLD",
    "JudgeConfig",
    "JudgeError",
    "OfflineJudge",
    "OpenAIJudge",
    "SubtaskVerdict",
    "UnreadableVerdict",
    "Verdict",
    "build_messages",
    "parse_verdict_text",
]

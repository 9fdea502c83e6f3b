"""Model clients for evaluation: an OpenAI-compatible HTTP endpoint, or a local ``transformers`` model.

Both take neutral messages (the layout of :mod:`verl_mopd.eval.messages`) and return the response text;
:func:`to_openai` converts them to OpenAI's chat format.

- :class:`OpenAIClient`: ``POST {base_url}/chat/completions`` (SGLang, vLLM, or any
  OpenAI-compatible server), stdlib ``urllib`` only. Retries connection errors, timeouts,
  connections dropped mid-response (``IncompleteRead``, a bad status line), a body that is not
  JSON (a proxy's error page), 408, 409, 429, 500, 502, 503 and 504, with exponential backoff and
  jitter; ``Retry-After`` is honoured up to ``RetryPolicy.max_delay``. Other statuses and a JSON
  answer without a message fail at once with the server's words. Thread-safe: :func:`run_bounded`
  calls it from a pool of ``max_in_flight`` threads, which bounds the requests in flight.
  :meth:`OpenAIClient.post` sends a request body built elsewhere (the data judge's) through the
  same retries.
- :class:`TransformersClient`: greedy or sampled ``generate`` of a local checkpoint. With a
  multimodal processor (Qwen3-VL) the screenshots go through the processor's chat template;
  with a text-only tokenizer the images are dropped and counted (``images_dropped``), which
  keeps tiny CPU test models usable.
"""

from __future__ import annotations

import base64
import http.client
import json
import random
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif"))


def mime_type(data: bytes) -> str:
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return "image/png"


def to_openai(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Neutral messages -> OpenAI chat format (images as base64 ``data:`` URLs)."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        parts = []
        for p in content:
            if p["type"] == "text":
                parts.append({"type": "text", "text": p["text"]})
            else:
                data = p["image"]
                url = f"data:{mime_type(data)};base64,{base64.b64encode(data).decode('ascii')}"
                parts.append({"type": "image_url", "image_url": {"url": url}})
        out.append({"role": m["role"], "content": parts})
    return out


RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class ClientError(RuntimeError):
    """A request that failed for good (non-retryable status, or retries exhausted)."""

    def __init__(self, message: str, status: int | None = None, attempts: int = 1):
        super().__init__(message)
        self.status = status
        self.attempts = attempts


@dataclass(frozen=True)
class RetryPolicy:
    """``delay(attempt) = min(max_delay, base_delay * 2**attempt) * uniform(1 - jitter, 1)``."""

    max_retries: int = 5
    base_delay: float = 1.0
    max_delay: float = 60.0
    jitter: float = 0.5

    def __post_init__(self):
        if not (isinstance(self.max_retries, int) and self.max_retries >= 0):
            raise ValueError(f"max_retries={self.max_retries!r}: must be an int >= 0")
        if not (self.base_delay >= 0 and self.max_delay >= self.base_delay):
            raise ValueError(f"base_delay={self.base_delay}, max_delay={self.max_delay}: need 0 <= base <= max")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter={self.jitter!r}: must be in [0, 1]")

    def delay(self, attempt: int, rng: random.Random) -> float:
        d = min(self.max_delay, self.base_delay * (2**attempt))
        return d * (1 - self.jitter * rng.random())


@dataclass
class OpenAIClient:
    """Chat completions against an OpenAI-compatible server.

    Attributes:
        base_url: e.g. ``http://127.0.0.1:30000/v1`` (``/chat/completions`` is appended).
        model: the served model name.
        api_key: sent as ``Authorization: Bearer`` when given.
        max_tokens, temperature, top_p: sampling; greedy (temperature 0) by default, as the
            papers evaluate.
        timeout: seconds per request.
        extra_body: merged into every request body (e.g. ``{"top_k": -1}``, SGLang's
            ``{"chat_template_kwargs": {...}}``).
    """

    base_url: str
    model: str
    api_key: str | None = None
    max_tokens: int = 2048
    temperature: float = 0.0
    top_p: float = 1.0
    timeout: float = 300.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    extra_body: dict[str, Any] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.base_url, str) or not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url={self.base_url!r}: must start with http:// or https://")
        if not self.model:
            raise ValueError("model: the served model name is required")
        if not (isinstance(self.max_tokens, int) and self.max_tokens > 0):
            raise ValueError(f"max_tokens={self.max_tokens!r}: must be a positive int")
        self._url = self.base_url.rstrip("/") + "/chat/completions"
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()

    def _body(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": to_openai(messages),
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            **self.extra_body,
        }

    def _post(self, data: bytes) -> bytes:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self._url, data=data, headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            return resp.read()

    def complete(self, messages: list[dict[str, Any]]) -> str:
        """The first choice's message content; raises :class:`ClientError` when it gives up."""
        return self.post(self._body(messages))

    def post(self, body: Mapping[str, Any]) -> str:
        """POST a chat-completions ``body`` as given (its model, messages in OpenAI format and
        sampling) with this client's retries; the first choice's content, as :meth:`complete`."""
        data = json.dumps(body).encode("utf-8")
        last = ""
        status: int | None = None
        for attempt in range(self.retry.max_retries + 1):
            retry_after: float | None = None
            try:
                body = self._post(data)
            except urllib.error.HTTPError as e:
                status = e.code
                try:
                    detail = e.read().decode("utf-8", "replace")[:500]
                except (OSError, http.client.HTTPException):
                    detail = "(the body could not be read)"
                last = f"HTTP {e.code} from {self._url}: {detail}"
                if e.code not in RETRY_STATUS:
                    raise ClientError(last, status=e.code, attempts=attempt + 1) from None
                retry_after = _retry_after(e.headers.get("Retry-After") if e.headers else None)
            except (urllib.error.URLError, TimeoutError, OSError, http.client.HTTPException) as e:
                # connection refused/reset/closed, timeouts, a body cut short (IncompleteRead),
                # a garbled status line (BadStatusLine)
                status = None
                last = f"{type(e).__name__} talking to {self._url}: {e}"
            else:
                try:
                    payload = json.loads(body.decode("utf-8", "replace"))
                except ValueError as e:  # not JSON: a proxy's page or a truncated body, retried
                    status, last = 200, f"a body that is not JSON from {self._url} ({e}): {body[:200]!r}"
                else:
                    try:
                        return _content(payload)
                    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
                        raise ClientError(f"bad response from {self._url}: {type(e).__name__}: {e}", attempts=attempt + 1) from None
            if attempt == self.retry.max_retries:
                break
            with self._lock:
                delay = self.retry.delay(attempt, self._rng)
            # a server's Retry-After is honoured, but never past our own cap on one wait
            time.sleep(min(self.retry.max_delay, max(delay, retry_after or 0.0)))
        raise ClientError(f"gave up after {self.retry.max_retries + 1} attempts: {last}", status, self.retry.max_retries + 1)


def _content(payload: dict[str, Any]) -> str:
    message = payload["choices"][0]["message"]
    content = message.get("content") or ""
    if isinstance(content, list):  # some servers return content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    reasoning = message.get("reasoning_content")
    if reasoning and "</think>" not in content:
        # reasoning parsers (SGLang/vLLM --reasoning-parser) split the thought off; put it back
        # as the trained model wrote it, so the reward parser sees the same text it saw in RL
        content = f"{reasoning}</think>{content}"
    return content


def _retry_after(value: str | None) -> float | None:
    """Seconds of a ``Retry-After`` header (delay-seconds form); None when absent or unreadable."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds == seconds and seconds >= 0 else None


def run_bounded(
    fn: Callable[[Any], Any], items: Iterable[Any], max_in_flight: int
) -> Iterator[tuple[Any, Any, BaseException | None]]:
    """Apply ``fn`` to ``items`` with at most ``max_in_flight`` calls running; yield as they finish.

    Yields ``(item, result, error)``; ``error`` is the exception ``fn`` raised (``result`` None).
    Items are submitted lazily, so a long iterator never queues more than ``max_in_flight``.
    """
    if not (isinstance(max_in_flight, int) and max_in_flight >= 1):
        raise ValueError(f"max_in_flight={max_in_flight!r}: must be an int >= 1")
    it = iter(items)
    with ThreadPoolExecutor(max_workers=max_in_flight) as pool:
        running: dict[Future, Any] = {}
        for item in it:
            running[pool.submit(fn, item)] = item
            if len(running) >= max_in_flight:
                break
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                item = running.pop(fut)
                err = fut.exception()
                yield item, (None if err else fut.result()), err
                nxt = next(it, _END)
                if nxt is not _END:
                    running[pool.submit(fn, nxt)] = nxt


_END = object()


class TransformersClient:
    """Local generation with ``transformers`` (CPU or GPU); one request at a time.

    Args:
        model_path: a checkpoint directory (``AutoModelForCausalLM`` or, for Qwen3-VL,
            ``AutoModelForImageTextToText``; picked from the config).
        max_new_tokens, temperature: decoding (``temperature == 0``: greedy).
        device, dtype: where to run; default CPU float32.
        model, processor: already-built objects instead of ``model_path`` (tests, notebooks).
    """

    def __init__(
        self,
        model_path: str | None = None,
        *,
        max_new_tokens: int = 512,
        temperature: float = 0.0,
        device: str = "cpu",
        dtype: str = "float32",
        model: Any = None,
        processor: Any = None,
    ):
        import torch
        import transformers

        if (model is None) != (processor is None):
            raise ValueError("give both model= and processor=, or model_path")
        if model is None:
            if not model_path:
                raise ValueError("model_path: a checkpoint directory is required")
            config = transformers.AutoConfig.from_pretrained(model_path)
            torch_dtype = getattr(torch, dtype)
            is_vl = hasattr(config, "vision_config")
            auto = transformers.AutoModelForImageTextToText if is_vl else transformers.AutoModelForCausalLM
            model = auto.from_pretrained(model_path, dtype=torch_dtype).to(device)
            processor = (transformers.AutoProcessor if is_vl else transformers.AutoTokenizer).from_pretrained(model_path)
        self.model = model.eval()
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.multimodal = hasattr(processor, "image_processor")
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.device = device
        self.images_dropped = 0
        self._lock = threading.Lock()  # generate is not re-entrant on one model

    def _inputs(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        if self.multimodal:
            import io

            from PIL import Image

            msgs = [
                {
                    "role": m["role"],
                    "content": m["content"]
                    if isinstance(m["content"], str)
                    else [
                        p if p["type"] == "text" else {"type": "image", "image": Image.open(io.BytesIO(p["image"])).convert("RGB")}
                        for p in m["content"]
                    ],
                }
                for m in messages
            ]
            return self.processor.apply_chat_template(
                msgs, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
            )
        flat = []
        for m in messages:
            c = m["content"]
            if not isinstance(c, str):
                self.images_dropped += sum(1 for p in c if p["type"] == "image")
                c = "".join(p["text"] for p in c if p["type"] == "text")
            flat.append({"role": m["role"], "content": c})
        return self.tokenizer.apply_chat_template(
            flat, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
        )

    def complete(self, messages: list[dict[str, Any]]) -> str:
        import torch

        with self._lock:
            inputs = {k: v.to(self.device) if hasattr(v, "to") else v for k, v in self._inputs(messages).items()}
            sample = self.temperature > 0
            kwargs: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "do_sample": sample}
            if sample:
                kwargs["temperature"] = self.temperature
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
            with torch.no_grad():
                out = self.model.generate(**inputs, pad_token_id=pad, **kwargs)
            new = out[0, inputs["input_ids"].shape[1] :]
            # keep <think>/<tool_call> (not special in Qwen3) and drop EOS/pad, as verl decodes
            return self.tokenizer.decode(new, skip_special_tokens=True)

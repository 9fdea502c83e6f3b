"""Chat messages with screenshots, in the one neutral layout every client reads.

The neutral layout is verl's (``verl/utils/dataset/rl_dataset.py::_build_messages``): a list of
``{"role", "content"}`` where ``content`` is a string or a list of parts
``{"type": "text", "text": str}`` / ``{"type": "image", "image": bytes}``. :func:`expand_images`
turns a parquet row's ``prompt`` (strings with ``<image>`` placeholders) plus its ``images`` column
(dicts with ``bytes`` or ``path``, or plain paths, as verl's RLHFDataset reads them) into it, so
the model sees exactly the interleaving the trainer built. Clients then convert:
:func:`verl_mopd.clients.to_openai` (``image_url`` data URIs) or the transformers client (PIL images).
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterable, Mapping

_PLACEHOLDER = re.compile(r"(<image>)")


def image_bytes(image: Any, where: str = "images") -> bytes:
    """Raw encoded bytes of one ``images`` entry: ``{"bytes": b}``, ``{"path": p}``, a path, or bytes."""
    if isinstance(image, (bytes, bytearray)):
        return bytes(image)
    if isinstance(image, Mapping):
        if image.get("bytes") is not None:
            return bytes(image["bytes"])
        if image.get("path"):
            image = image["path"]
        elif image.get("image") is not None:
            return image_bytes(image["image"], where)
        else:
            raise ValueError(f"{where}={_keys(image)}: an image needs 'bytes' or 'path'")
    if isinstance(image, (str, os.PathLike)):
        path = os.fspath(image)
        if path.startswith("file://"):
            path = path[len("file://") :]
        with open(path, "rb") as f:
            return f.read()
    if hasattr(image, "save"):  # a PIL image
        import io

        buf = io.BytesIO()
        image.save(buf, format="PNG")
        return buf.getvalue()
    raise ValueError(f"{where}: unsupported image of type {type(image).__name__}; allowed: dict with bytes/path, path, bytes")


def _keys(d: Mapping) -> str:
    return "{" + ", ".join(repr(k) for k in d) + "}"


def expand_images(prompt: Iterable[Mapping[str, Any]], images: list[Any] | None) -> list[dict[str, Any]]:
    """``prompt`` (+ ``images``) -> neutral messages; ``<image>`` placeholders filled in order.

    Raises ValueError when the placeholders and the images do not pair up one to one.
    """
    images = list(images) if images is not None else []
    out: list[dict[str, Any]] = []
    used = 0
    for i, message in enumerate(prompt):
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str):
            raise ValueError(f"prompt[{i}].role={role!r}: expected a string")
        if isinstance(content, str):
            if "<image>" not in content:
                out.append({"role": role, "content": content})
                continue
            parts: list[dict[str, Any]] = []
            for seg in _PLACEHOLDER.split(content):
                if seg == "<image>":
                    if used >= len(images):
                        raise ValueError(f"prompt[{i}] has more <image> placeholders than the {len(images)} images")
                    parts.append({"type": "image", "image": image_bytes(images[used], f"images[{used}]")})
                    used += 1
                elif seg:
                    parts.append({"type": "text", "text": seg})
            out.append({"role": role, "content": parts})
        elif isinstance(content, (list, tuple)) or hasattr(content, "tolist"):
            parts = []
            for part in list(content):
                kind = part.get("type")
                if kind == "text":
                    parts.append({"type": "text", "text": part["text"]})
                elif kind == "image":
                    src = part.get("image") if part.get("image") is not None else images[used] if used < len(images) else None
                    if src is None:
                        raise ValueError(f"prompt[{i}] has an image part without an image")
                    if part.get("image") is None:
                        used += 1
                    parts.append({"type": "image", "image": image_bytes(src, f"prompt[{i}].image")})
                else:
                    raise ValueError(f"prompt[{i}] content part type={kind!r}; allowed: 'text', 'image'")
            out.append({"role": role, "content": parts})
        else:
            raise ValueError(f"prompt[{i}].content is a {type(content).__name__}; expected a string or a list of parts")
    if used != len(images):
        raise ValueError(f"{len(images)} images but {used} <image> placeholders in the prompt")
    return out

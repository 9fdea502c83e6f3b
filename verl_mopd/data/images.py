"""Screenshot files: where a path from the data may point, and whether the file is a usable image.

Every image the pipeline reads (into parquet, into a judge request, for a screen size) passes
two checks:

- :meth:`DataRoots.resolve`: a path from the data is joined to its file's data root (the JSONL's
  folder, or the image folder of a reader) and resolved with symlinks (``os.path.realpath``). It
  must land under the data root or under an explicitly allowed root (``--image-root``); anything
  else is refused and never opened, so ``../../etc/passwd`` or a symlink out of the data cannot
  leak a file into the parquet or to a judge server.
- :func:`inspect_image`: the file is read once. Its SHA-256 (the ``structure`` rule's duplicate
  test and ``prepare``'s fingerprint) is taken, then Pillow identifies it, accepting only
  :data:`IMAGE_FORMATS`. A PNG is checked with ``verify()``, which reads every chunk through
  ``IEND`` and checks its CRC: that catches truncation and corruption without decoding pixels
  (about 2 ms for a 1920x1080 screenshot). Other formats are fully decoded, because their
  ``verify()`` checks nothing. ``decode=True`` decodes PNGs too (about 30 ms each).
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Sequence

IMAGE_FORMATS = ("PNG", "JPEG", "WEBP")
MAX_IMAGE_BYTES = 64 << 20  # a 4K PNG screenshot is ~25 MB; larger is not a screenshot
MISSING = "does not exist"


@dataclass(frozen=True)
class DataRoots:
    """Where a data file's screenshots may be: relative paths join ``base``; every path, once
    resolved (symlinks included), must lie under one of ``allowed`` (``base`` and any extra root)."""

    base: str
    allowed: tuple[str, ...]

    @classmethod
    def of(cls, base: str, extra: Sequence[str] = ()) -> "DataRoots":
        base = os.path.abspath(base)
        return cls(base, tuple(dict.fromkeys(os.path.realpath(r) for r in (base, *extra))))

    def resolve(self, raw: str) -> tuple[str, str | None]:
        """``(real path, None)``, or ``(raw, why it is refused)``. Never opens the file."""
        if "\x00" in raw:
            return raw, "contains a NUL byte"
        real = os.path.realpath(raw if os.path.isabs(raw) else os.path.join(self.base, raw))
        for root in self.allowed:
            if os.path.commonpath([real, root]) == root:
                return real, None
        roots = " or ".join(self.allowed)
        return raw, f"resolves to {real}, outside the data root {roots} (allow a folder with --image-root)"


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What :func:`inspect_image` found; ``problem`` is None for a usable image."""

    sha256: bytes  # digest of the file's bytes; b"" when it could not be read
    size: tuple[int, int] | None  # (width, height)
    format: str
    nbytes: int
    problem: str | None


def _bad(problem: str, nbytes: int = 0, sha: bytes = b"") -> ImageInfo:
    return ImageInfo(sha, None, "", nbytes, problem)


def identify(data: bytes, decode: bool = False) -> tuple[str, tuple[int, int]]:
    """``(format, (width, height))`` of image bytes; raises ValueError saying what is wrong."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as im:
            fmt, size = im.format or "", im.size
            if size[0] * size[1] > Image.MAX_IMAGE_PIXELS:
                raise ValueError(f"is {size[0]}x{size[1]} pixels, more than Pillow's limit {Image.MAX_IMAGE_PIXELS}")
            if fmt == "PNG" and not decode:
                im.verify()
            else:
                im.load()
    except UnidentifiedImageError:
        formats = " / ".join(IMAGE_FORMATS)
        raise ValueError(f"is not a {formats} image (or is cut off before its first image data)") from None
    except ValueError:
        raise
    except Exception as e:  # untrusted bytes: whatever a decoder raises means "not usable"
        raise ValueError(f"is a truncated or corrupt image ({type(e).__name__}: {e})") from None
    return fmt, size


def inspect_image(path: str, decode: bool = False) -> ImageInfo:
    """Read ``path`` once: SHA-256, format, size, and whether Pillow can check it (see the module doc)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return _bad(MISSING)
    except OSError as e:
        return _bad(f"cannot be read ({e.strerror})")
    if not stat.S_ISREG(st.st_mode):
        return _bad("is not a regular file")
    if st.st_size == 0:
        return _bad("is empty (0 bytes)")
    if st.st_size > MAX_IMAGE_BYTES:
        return _bad(f"is {st.st_size} bytes, more than {MAX_IMAGE_BYTES}", st.st_size)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return _bad(f"cannot be read ({e.strerror})", st.st_size)
    sha = hashlib.sha256(data).digest()
    try:
        fmt, size = identify(data, decode)
    except ValueError as e:
        return _bad(str(e), len(data), sha)
    return ImageInfo(sha, size, fmt, len(data), None)


class ImageIndex:
    """Each screenshot file inspected once: ``path -> ImageInfo``, filled in parallel by :meth:`scan`.

    Steps whose path was refused (``Step.path_error``) are never opened: :meth:`of` answers for
    them from the refusal alone.
    """

    def __init__(self, decode: bool = False):
        self.decode = decode
        self._infos: dict[str, ImageInfo] = {}

    def scan(self, paths: Iterable[str], workers: int = 4, progress: bool = False) -> None:
        todo = [p for p in dict.fromkeys(paths) if p not in self._infos]
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            it = pool.map(lambda p: inspect_image(p, self.decode), todo)
            if progress:
                from tqdm import tqdm

                it = tqdm(it, total=len(todo), desc="images", unit="img")
            for p, info in zip(todo, it, strict=True):
                self._infos[p] = info

    def of(self, step) -> ImageInfo:
        """The step's screenshot; a refused path gives its refusal as the problem."""
        if step.path_error:
            return _bad(step.path_error)
        info = self._infos.get(step.screenshot)
        if info is None:
            info = self._infos[step.screenshot] = inspect_image(step.screenshot, self.decode)
        return info

    def summary(self) -> dict:
        """Counts for the report: files checked, usable, their bytes, and the commonest sizes."""
        usable = [i for i in self._infos.values() if i.problem is None]
        sizes: dict[str, int] = {}
        for i in usable:
            key = f"{i.size[0]}x{i.size[1]}"
            sizes[key] = sizes.get(key, 0) + 1
        top = dict(sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))[:10])
        return {"files": len(self._infos), "usable": len(usable), "bytes": sum(i.nbytes for i in usable), "sizes": top}


def read_screenshot(step, expect_sha256: bytes | None = None) -> bytes:
    """The bytes of a step's screenshot, for the parquet or a judge request.

    Refuses (ValueError naming the path) a path outside the data roots, and bytes that are not
    what :class:`ImageIndex` checked (``expect_sha256``: the file changed during the run).
    """
    if step.path_error:
        raise ValueError(f"screenshot {step.screenshot!r} {step.path_error}; refusing to read it")
    st = os.stat(step.screenshot)
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_IMAGE_BYTES:  # a FIFO would block, a device never end
        raise ValueError(f"screenshot {step.screenshot!r} is not a regular file of at most {MAX_IMAGE_BYTES} bytes")
    with open(step.screenshot, "rb") as f:
        data = f.read()
    if expect_sha256 is not None and hashlib.sha256(data).digest() != expect_sha256:
        raise ValueError(f"screenshot {step.screenshot!r} changed since it was checked; rerun prepare")
    return data


__all__ = [
    "IMAGE_FORMATS",
    "MAX_IMAGE_BYTES",
    "MISSING",
    "DataRoots",
    "ImageIndex",
    "ImageInfo",
    "identify",
    "inspect_image",
    "read_screenshot",
]

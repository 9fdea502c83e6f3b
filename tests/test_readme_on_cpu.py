"""The README is the map, and it stays true: its length, its map, its commands, its config table, its links.

Checks, each against the repository rather than a copy of it:

- README.md is under 250 lines and its ``## Map`` starts in the first third;
- the commands of "Set up" are exactly the two commands ``.ci/run`` runs;
- the map names every subpackage and top-level module of ``verl_mopd``, and every ``*.py`` or folder
  it names exists where the map puts it;
- the ``mopd:`` table lists exactly the fields of ``MOPDConfig``, with their defaults;
- every relative link (and ``#anchor``) of README.md, docs/*.md and examples/*/README.md resolves;
- no project document cites the build process's own files (``shared/...``), which a clone lacks.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PACKAGE = ROOT / "verl_mopd"


def _lines() -> list[str]:
    return README.read_text().splitlines()


def _section(title: str) -> list[str]:
    lines = _lines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"## {title}"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start + 1:end]


def _fence(lines: list[str], lang: str = "") -> list[str]:
    """The body of the first ``` fence (of language ``lang``) in ``lines``."""
    start = next(i for i, line in enumerate(lines) if line.strip() == f"```{lang}")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].strip() == "```")
    return lines[start + 1:end]


def test_readme_is_short_with_the_map_in_its_first_third():
    lines = _lines()
    assert len(lines) < 250, f"README.md has {len(lines)} lines; the manual belongs in docs/"
    where = next(i for i, line in enumerate(lines) if line.startswith("## Map"))
    assert where < len(lines) / 3, f"'## Map' is at line {where + 1} of {len(lines)}: move it into the first third"


def test_set_up_commands_are_what_ci_runs():
    readme = [line.split("#")[0].strip() for line in _fence(_section("Set up"), "bash")]
    readme = [line for line in readme if line]
    script = (ROOT / ".ci" / "run").read_text()
    marker = '# --- README "Set up" ---'
    assert marker in script, f".ci/run has no line {marker!r} above the README's commands"
    # above the marker: preparing the machine (finding Python 3.12), not a command of the README
    ci = [line.strip() for line in script.split(marker, 1)[1].splitlines()
          if line.strip() and not line.lstrip().startswith(("#", "set ", "cd "))]
    assert [c.removeprefix("python -m ") for c in ci] == [r.removeprefix("python -m ") for r in readme], (ci, readme)


def _map_entries() -> list[tuple[str, str]]:
    """(path relative to the repository, description) for each entry of the map's fence."""
    entries, top, last_dir = [], None, None
    for line in _fence(_section("Map")):
        indent = len(line) - len(line.lstrip())
        first, _, rest = line.strip().partition(" ")
        if indent == 0:  # a top-level folder (verl_mopd/, recipes/ui_mopd/, docs/, ...)
            top = first.rstrip("/")
            last_dir = top
            entries.append((top, rest))
        elif indent == 2 and top == "verl_mopd":
            path = f"verl_mopd/{first.rstrip('/')}"
            last_dir = path if first.endswith("/") else "verl_mopd"
            entries.append((path, rest))
        else:  # a continuation of the previous entry's description
            entries.append((last_dir, line.strip()))
    return entries


def test_the_map_names_every_subpackage_and_module():
    named = {path for path, _ in _map_entries()}
    for child in sorted(PACKAGE.iterdir()):
        if child.name.startswith("__") or child.name.endswith(".pyc"):
            continue
        if child.is_dir() and (child / "__init__.py").exists():
            assert f"verl_mopd/{child.name}" in named, f"the README map does not name verl_mopd/{child.name}/"
        elif child.suffix == ".py":
            rel = f"verl_mopd/{child.name}"
            mentioned = rel in named or any(re.search(rf"(?<![\w/]){re.escape(child.name)}", d)
                                            for p, d in _map_entries()
                                            if p == "verl_mopd" or p.count("/") == 1 and p.endswith(".py"))
            assert mentioned, f"the README map does not name {rel}"


def test_the_map_names_only_what_exists():
    for path, description in _map_entries():
        assert (ROOT / path).exists(), f"the README map names {path}, which does not exist"
        base = ROOT / path if (ROOT / path).is_dir() else (ROOT / path).parent
        for name in re.findall(r"(?<![\w./-])([\w/]+\.py)\b", description):
            candidates = [base / name, ROOT / name, *[d / name for d in base.iterdir() if d.is_dir()]]
            assert any(c.exists() for c in candidates), f"the README map names {name} under {path}/: not found"


def test_the_mopd_table_lists_exactly_the_config_fields():
    from verl_mopd.config import MOPDConfig

    text = README.read_text()
    block = text.split("<!-- mopd-config:start -->")[1].split("<!-- mopd-config:end -->")[0]
    rows = {}
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`mopd."):
            rows[cells[0].strip("`").removeprefix("mopd.")] = cells[1].strip("`")
    fields = {f.name: f for f in dataclasses.fields(MOPDConfig) if not f.name.startswith("_")}
    assert sorted(rows) == sorted(fields), "README mopd table vs MOPDConfig fields"
    for name, field in fields.items():
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        shown = json.dumps(default) if isinstance(default, bool | dict) or default is None else str(default)
        assert rows[name] == shown, f"README says mopd.{name} defaults to {rows[name]}, MOPDConfig says {shown}"


def _documents() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").glob("*/README.md")),
            ROOT / "examples" / "README.md"]


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"^#{1,6} ", line):
            anchors.add(_slug(line.lstrip("#")))
    return anchors


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^(https?|mailto):", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        assert resolved.exists(), f"{doc.relative_to(ROOT)} links to {target}: {path} does not exist"
        if anchor:
            assert resolved.suffix == ".md", f"{doc.relative_to(ROOT)}: an anchor into {path}"
            assert anchor in _anchors(resolved), (
                f"{doc.relative_to(ROOT)} links to {target}: no heading of {resolved.name} has that anchor")


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_documents_cite_only_what_a_clone_has(doc):
    cited = re.findall(r"shared/(?:review|seeds|reference|hooks|DESIGN\.md|STYLE\.md)\S*", doc.read_text())
    assert not cited, f"{doc.relative_to(ROOT)} cites the build process's files, which a clone lacks: {cited}"


def test_the_contributor_page_is_linked_and_names_only_what_exists():
    """docs/contributing.md (its links are checked above, with every page's): the README links it, and
    every file it names (``verl_mopd/...``, ``tests/...``, or a module path relative to the package such
    as ``checks/validate.py``) and every ``module.name`` of the package it names exist."""
    import importlib

    page = ROOT / "docs" / "contributing.md"
    assert page in _documents() and "](docs/contributing.md)" in README.read_text()
    text = page.read_text()
    for name in re.findall(r"`([\w/.-]+\.(?:py|sh|yaml))", text):
        candidates = [ROOT / name, PACKAGE / name]
        assert any(c.exists() for c in candidates), f"docs/contributing.md names {name}, which does not exist"
    for module, attr in re.findall(r"`(losses|verl_loss|errors|config)\.(?!py`)(\w+)", text):
        assert hasattr(importlib.import_module(f"verl_mopd.{module}"), attr), f"verl_mopd.{module}.{attr}"

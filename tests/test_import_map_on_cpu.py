"""The package's import map points one way: no import circle, no lazy re-export, no arrow up the README's map.

Every ``import`` of every module of ``verl_mopd`` counts, at module level or inside a function
(a deferred import still closes a circle; it only hides it until run time). A module imports
its package's ``__init__`` too, as Python does. A module-level ``__getattr__`` (PEP 562) is a
lazy re-export and is refused.

The README's map lists the package from the commands at the top to the method's core and the helpers
at the bottom; a module imports only modules of its own map entry or of an entry below it. The
exceptions are named in :data:`ARROWS_UP`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "verl_mopd"
README = PACKAGE.parent / "README.md"

#: the imports allowed to point up the map: (importer, imported) module prefixes, with the reason
ARROWS_UP = {
    ("verl_mopd.plugin", "verl_mopd.trainer"): "the registration imports the trainers it registers",
    ("verl_mopd.config", "verl_mopd.teachers.config"): "MOPDConfig builds mopd.teachers' TeacherConfig; "
                                                      "it moves to config.py with the teachers' next change",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports (``from a import b`` counts ``a.b`` when it is a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph = {name: _imports(name, path, known) for name, path in modules.items()}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_circle():
    graph = _graph()
    cycles = _cycles(graph)
    detail = "\n".join(
        " <-> ".join(c) + "\n    " + "\n    ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c)
        for c in cycles)
    assert not cycles, f"import circles in verl_mopd:\n{detail}"


def test_no_module_has_a_lazy_re_export():
    lazy = []
    for name, path in _modules().items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                lazy.append(name)
            elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__getattr__" for t in node.targets):
                lazy.append(name)
    assert not lazy, f"module-level __getattr__ (a lazy re-export) in {lazy}: import the name where it is used"


def _map_ranks() -> dict[str, int]:
    """``{module or subpackage of verl_mopd: its entry's place on README's map}``; an entry line may name
    more top-level modules (``files.py`` beside ``errors.py``), which share its place."""
    lines = README.read_text().splitlines()
    start = lines.index("verl_mopd/")
    ranks: dict[str, int] = {}
    head = ""
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        if not line.startswith("   "):  # a new entry (deeper lines continue the one above)
            head = line.split()[0]
            ranks[head.rstrip("/").removesuffix(".py")] = len(ranks)
        if head.endswith(".py"):  # a top-level entry: its other top-level modules
            for name in re.findall(r"(?<![\w/])(_?\w+)\.py", line):
                if (PACKAGE / f"{name}.py").is_file():
                    ranks.setdefault(name, ranks[head.removesuffix(".py")])
    return ranks


def _entry(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # verl_mopd itself (its __version__) sits under everything


def test_the_map_places_every_module():
    ranks = _map_ranks()
    missing = sorted({_entry(m) for m in _modules()} - set(ranks) - {None})
    assert not missing, f"README's map does not place {missing}"


def test_no_module_imports_one_above_it_on_the_map():
    ranks = _map_ranks()
    up = []
    for importer, imported in sorted(_graph().items()):
        for target in sorted(imported):
            a, b = _entry(importer), _entry(target)
            if a is None or b is None or ranks[a] <= ranks[b]:  # the same entry (line), or one below
                continue
            if any(importer.startswith(i) and target.startswith(t) for i, t in ARROWS_UP):
                continue
            up.append(f"{importer} -> {target} ({a} sits below {b} on the map)")
    assert not up, "imports that point up README's map:\n  " + "\n  ".join(up)

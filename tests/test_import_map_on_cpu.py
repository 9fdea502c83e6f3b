"""The package's import map points one way: no import circle, no lazy re-export.

Every ``import`` of every module of ``verl_mopd`` counts, at module level or inside a function
(a deferred import still closes a circle; it only hides it until run time). A module imports
its package's ``__init__`` too, as Python does. A module-level ``__getattr__`` (PEP 562) is a
lazy re-export and is refused.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "verl_mopd"


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

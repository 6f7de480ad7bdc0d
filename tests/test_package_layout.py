"""The package's shape: product modules never import test-only code, and imports form no cycle.

Every ``import`` statement counts, module-level or inside a function: a lazy import that only dodges a
cycle is still a cycle. Product = every module of ``sglang_replayssm`` outside ``sglang_replayssm.testing``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sglang_replayssm

ROOT = Path(sglang_replayssm.__file__).parent
TEST_ONLY_TOP = {"unittest", "pytest", "hypothesis", "tests"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Absolute names imported anywhere in ``path`` (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}


def _graph() -> dict[str, set[str]]:
    """Edges between our own modules (``from pkg import mod`` resolves to the module when it exists)."""
    return {name: {n for n in _imports(path) if n in MODULES and n != name} for name, path in MODULES.items()}


def _test_only(name: str) -> bool:
    return name.startswith("sglang_replayssm.testing") or name.split(".")[0] in TEST_ONLY_TOP


def test_product_modules_import_no_test_only_code():
    offenders = {
        name: sorted(n for n in _imports(path) if _test_only(n))
        for name, path in MODULES.items()
        if not name.startswith("sglang_replayssm.testing")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_import_cycle():
    graph = _graph()
    # A package's __init__ importing its own submodules is not a cycle by itself; drop edges from a
    # package to its children so that only real loops between modules are reported.
    for name in graph:
        graph[name] = {n for n in graph[name] if not n.startswith(name + ".")}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert cycles == []


def test_the_graph_sees_lazy_imports():
    """The checker itself: an import inside a function is an edge (so the cycle test can fail)."""
    graph = _graph()
    assert "sglang_replayssm.radix.config" in graph["sglang_replayssm.radix.hooks"]
    assert any(graph[name] for name in graph if name.startswith("sglang_replayssm.cpu"))


def test_no_source_file_over_500_lines():
    """Small modules: every Python file of the package, the tests and the scripts (the CUDA source excepted)."""
    repo = ROOT.parent
    long = {
        str(p.relative_to(repo)): n
        for folder in ("sglang_replayssm", "tests", "scripts")
        for p in (repo / folder).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert long == {}


def test_kernels_import_no_feature_code():
    """Kernels receive their choices as arguments or read them from ``settings`` (a leaf): no module of
    ``kernels`` imports the adapter, the CPU runtime, the plugin or the bench."""
    features = ("radix", "cpu", "plugin", "bench")
    graph = _graph()
    offenders = {
        name: sorted(n for n in edges if n.split(".")[1:2] and n.split(".")[1] in features)
        for name, edges in graph.items()
        if name.startswith("sglang_replayssm.kernels")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_settings_is_a_leaf():
    """``settings`` imports nothing of the package, so every layer may read it."""
    assert _graph()["sglang_replayssm.settings"] == set()

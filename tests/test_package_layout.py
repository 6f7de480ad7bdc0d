"""The package's shape: product modules never import test or lab code, and imports form no cycle.

Every ``import`` statement counts, module-level or inside a function: a lazy import that only dodges a
cycle is still a cycle. Product = every module of ``sglang_replayssm``; test code lives in ``tests/``,
research code in ``lab/``, neither packaged (tests/test_wheel_contents.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import sglang_replayssm

ROOT = Path(sglang_replayssm.__file__).parent
#: Top-level names the product never imports: test frameworks, the tests (``tests.support``) and the lab.
TEST_ONLY_TOP = {"unittest", "pytest", "hypothesis", "tests", "lab"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Absolute names imported anywhere in ``path`` (relative imports resolved)."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    return _imports_of(path.read_text(), package, str(path))


def _imports_of(source: str, package: str, filename: str = "<string>") -> set[str]:
    """Absolute names imported anywhere in ``source``, a module of ``package``."""
    tree = ast.parse(source, filename=filename)
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
    return name.split(".")[0] in TEST_ONLY_TOP


def test_product_modules_import_no_test_or_lab_code():
    offenders = {name: sorted(n for n in _imports(path) if _test_only(n)) for name, path in MODULES.items()}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_checker_sees_test_and_lab_imports():
    """The checker itself: a plain, a from and a lazy import of ``tests`` / ``lab`` are all test-only."""
    source = "import tests.support\nfrom tests.support import serve\n\ndef f():\n    from lab.kernels import x\n"
    found = {n for n in _imports_of(source, "sglang_replayssm.cpu") if _test_only(n)}
    assert found == {"tests.support", "tests.support.serve", "lab.kernels", "lab.kernels.x"}


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
    """Small modules: every Python file of the package, the tests, the scripts and the lab (CUDA sources excepted)."""
    repo = ROOT.parent
    long = {
        str(p.relative_to(repo)): n
        for folder in ("sglang_replayssm", "tests", "scripts", "lab")
        for p in (repo / folder).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert long == {}


# ---- radix/: features as rooms ------------------------------------------------------------------

RADIX = "sglang_replayssm.radix"
#: The feature rooms (subpackages of radix/); radix/ring/ and radix/'s top-level modules are the core.
ROOMS = ("records", "read_copy", "spec", "pd", "eviction")
#: The one core module that imports rooms: it assembles their hooks tables and installs their strategies.
ASSEMBLER = f"{RADIX}.hooks"
#: Room -> room imports allowed, each with its reason.
ROOM_EXCEPTIONS = {
    (f"{RADIX}.records.capture", f"{RADIX}.spec.ring"):
        "records captured beside the spec-verify ring read its rows (fix record_spec_ring)",
    (f"{RADIX}.records.donation", f"{RADIX}.spec.ring"):
        "the end-state donation folds the spec row's pending accepted records first (fix record_spec_ring)",
}


def _room(module: str) -> str | None:
    """The room of a radix module ("core" for radix/'s top level and radix/ring/), None outside radix/."""
    parts = module.split(".")
    if parts[:2] != RADIX.split(".") or len(parts) < 3:
        return None
    return parts[2] if parts[2] in ROOMS else "core"


def test_core_never_imports_a_feature_room():
    """A feature that changes a core behaviour installs a strategy into the core (at registration)."""
    offenders = {
        (name, dep)
        for name, deps in _graph().items()
        if _room(name) == "core" and name != ASSEMBLER
        for dep in deps
        if _room(dep) not in (None, "core")
    }
    assert offenders == set()


def test_the_assembler_imports_only_the_rooms_hooks_tables():
    deps = {dep for dep in _graph()[ASSEMBLER] if _room(dep) not in (None, "core")}
    assert deps and all(dep.endswith(".hooks") or dep.split(".")[-1] in (*ROOMS, "hicache") for dep in deps), deps


def test_rooms_import_each_other_only_through_declared_exceptions():
    edges = {
        (name, dep)
        for name, deps in _graph().items()
        if _room(name) not in (None, "core")
        for dep in deps
        if _room(dep) not in (None, "core", _room(name))
    }
    assert edges == set(ROOM_EXCEPTIONS)


def test_radix_top_level_has_at_most_eight_modules():
    top = sorted(p.name for p in (ROOT / "radix").glob("*.py"))
    assert len(top) <= 8, top
    assert {p.name for p in (ROOT / "radix").iterdir() if p.is_dir() and (p / "__init__.py").exists()} >= {
        "ring", *ROOMS}


def test_our_state_rides_on_sglang_objects_only_through_the_state_object():
    """One attribute of ours on an SGLang object (``_replayssm_state``), named and set only in state.py."""
    offenders = {
        name: [node.value for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Constant) and isinstance(node.value, str)
               and node.value.startswith("_replayssm_")]
        for name, path in MODULES.items()
        if name != "sglang_replayssm.state" and not name.startswith("tests.")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def _pointer_uses(source: str) -> list[int]:
    """Lines of ``source`` where an address (``.data_ptr()``) is used other than in an alignment test
    (``x.data_ptr() % n``): a key, a stored value, a comparison."""
    tree = ast.parse(source)
    aligned = {id(node.left) for node in ast.walk(tree)
               if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod)}  # fmt: skip
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "data_ptr" and id(node) not in aligned]  # fmt: skip


def test_the_adapter_finds_state_through_objects_not_addresses():
    """No registry keyed by pointers: the adapter reaches a pool's state (a layer's read copy included)
    through the objects SGLang hands it (the state object, ``state.py``), never by a tensor's address."""
    offenders = {name: _pointer_uses(path.read_text()) for name, path in MODULES.items()
                 if name.startswith("sglang_replayssm.radix")}  # fmt: skip
    assert {k: v for k, v in offenders.items() if v} == {}
    assert _pointer_uses("_LAYERS[t.data_ptr()] = 1\nok = t.data_ptr() % 16") == [1]


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

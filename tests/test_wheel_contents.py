"""What the wheel ships: the product package only (no test, lab or research code), in small files.

The wheel is built for real (``pip wheel --no-deps --no-build-isolation --no-index``, offline, with this
environment's setuptools) from a copy of the tree that keeps ``tests/``, ``lab/`` and ``scripts/`` beside
the package, so a packaging rule that let them in would show here. The copy keeps the worktree free of
``build/`` and ``*.egg-info``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "sglang_replayssm"
#: What the build reads, plus the folders that must stay out of the wheel.
COPIED = ("pyproject.toml", "README.md", PACKAGE, "tests", "lab", "scripts")
#: No path of the wheel may have one of these folders in it.
FORBIDDEN_DIRS = {"testing", "tests", "lab", "experimental", "scripts"}
MAX_PY_LINES = 400
MAX_CUDA_LINES = 1000
#: Product files allowed over MAX_PY_LINES, each with its reason. An entry must still be over the limit
#: (a stale one fails the test, so that the list only shrinks).
PY_EXEMPT: dict[str, str] = {}
#: CUDA sources allowed over MAX_CUDA_LINES, each with its reason (same rule as PY_EXEMPT).
CUDA_EXEMPT: dict[str, str] = {}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.egg-info", "build")
    for name in COPIED:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "--no-index",
           "--disable-pip-version-check", "-q", "-w", str(out)]
    proc = subprocess.run(cmd, cwd=src, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = out.glob("sglang_replayssm-*.whl")
    with zipfile.ZipFile(built) as zf:
        yield zf


def _sources(wheel: zipfile.ZipFile, suffix: str) -> dict[str, int]:
    """Line count of every file of the wheel ending in ``suffix``."""
    return {n: len(wheel.read(n).decode().splitlines()) for n in wheel.namelist() if n.endswith(suffix)}


def test_wheel_holds_the_package_and_its_metadata_only(wheel: zipfile.ZipFile) -> None:
    tops = {name.split("/")[0] for name in wheel.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {PACKAGE}


def test_wheel_has_no_test_lab_or_research_code(wheel: zipfile.ZipFile) -> None:
    leaked = sorted(n for n in wheel.namelist() if FORBIDDEN_DIRS & set(n.split("/")[:-1]))
    assert leaked == []


def test_wheel_ships_what_the_product_loads(wheel: zipfile.ZipFile) -> None:
    """The positive side: the plugin's entry module, the kernels and the CUDA sources they compile."""
    names = set(wheel.namelist())
    assert {f"{PACKAGE}/plugin.py", f"{PACKAGE}/kernels/read_copy_cuda.py", f"{PACKAGE}/kernels/csrc/read_copy.cu",
            f"{PACKAGE}/kernels/csrc/ring_read.cu"} <= names


def test_no_product_python_file_over_400_lines(wheel: zipfile.ZipFile) -> None:
    lines = _sources(wheel, ".py")
    assert {n: c for n, c in lines.items() if c > MAX_PY_LINES and n not in PY_EXEMPT} == {}
    assert {n: lines.get(n) for n in PY_EXEMPT if lines.get(n, 0) <= MAX_PY_LINES} == {}, "stale exemption"


def test_no_cuda_source_over_1000_lines(wheel: zipfile.ZipFile) -> None:
    lines = _sources(wheel, ".cu")
    assert {n: c for n, c in lines.items() if c > MAX_CUDA_LINES and n not in CUDA_EXEMPT} == {}
    assert {n: lines.get(n) for n in CUDA_EXEMPT if lines.get(n, 0) <= MAX_CUDA_LINES} == {}, "stale exemption"

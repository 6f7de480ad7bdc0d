"""Lab GPU machine only: SGLang 0.5.23's Kimi-Linear MLP builds a ``DualGemm`` whose mode selection imports
``sglang.kernels.ops.gemm.cutedsl_dual_gemm``, which needs NVIDIA's CuTe DSL (``cutlass``), absent on the lab
H200. That kernel is SM100-only: on a Hopper GPU its predicate ``can_use_dual_gemm`` is False, so the layer
runs its plain gate/up path. Where ``cutlass`` cannot be imported, this finder serves that one module as the
three names ``DualGemm._select_mode`` imports, with the predicate False (what it answers on an H200).
A user's install (with the CuTe DSL, or on a GPU where SGLang imports it) never takes this path."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from enum import IntEnum

TARGET = "sglang.kernels.ops.gemm.cutedsl_dual_gemm"


class DualGemmQuantMode(IntEnum):
    STATIC_PER_TENSOR = 0
    STATIC_PER_TOKEN = 1
    DYNAMIC_PER_TENSOR = 2
    DYNAMIC_PER_TOKEN = 3
    UNQUANT = 4

    @property
    def is_quantized(self) -> bool:
        return self is not DualGemmQuantMode.UNQUANT


def can_use_dual_gemm(num_tokens: int, hidden_size: int, intermediate_size: int, quant_mode: object) -> bool:
    return False  # SM100 only (the real predicate's first test)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name != TARGET:
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.MAX_DUAL_GEMM_DECODE_TOKENS = 16  # type: ignore[attr-defined]
        module.DualGemmQuantMode = DualGemmQuantMode  # type: ignore[attr-defined]
        module.can_use_dual_gemm = can_use_dual_gemm  # type: ignore[attr-defined]


def install() -> None:
    if importlib.util.find_spec("cutlass") is not None or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())

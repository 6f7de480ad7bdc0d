"""CPU stand-in for the `sgl_kernel` package (imported AS `sgl_kernel`, see cpu/autoload.py).

Active only where libcuda cannot load. It supplies, as torch reference code, every
`torch.ops.sgl_kernel.*` op and `sgl_kernel.*` function SGLang 0.5.23 reaches on its CPU engine
for the GDN (Qwen3.5) and KDA (Kimi-Linear) hybrids. Any other name resolves to a stub that raises
`NotImplementedError` naming the op when called, so nothing runs silently with a wrong kernel.
"""

from __future__ import annotations

import importlib
import logging
import sys
import types

logger = logging.getLogger("sglang_replayssm.cpu")

__version__ = "0.0.0+sglang-replayssm-cpu-standin"


class MissingOp:
    """Placeholder for an sgl_kernel name the stand-in does not implement: fails loudly when called."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"{self._name} has no CPU implementation in the sglang-replayssm sgl_kernel stand-in "
            f"(no CUDA driver on this machine)."
        )

    def __getattr__(self, attr: str) -> MissingOp:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return MissingOp(f"{self._name}.{attr}")

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in: missing {self._name}>"


def _missing_getattr(module_name: str):
    def __getattr__(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return MissingOp(f"{module_name}.{attr}")

    return __getattr__


def submodule(target: str, alias: str) -> types.ModuleType:
    """The module to bind as `alias` (sgl_kernel[.x]): our implementation if we have one, else a stub."""
    if target == __name__:
        return sys.modules[__name__]
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name != target:
            raise
    module = types.ModuleType(alias)
    module.__path__ = []  # behave like a package so deeper imports resolve too
    module.__getattr__ = _missing_getattr(alias)  # type: ignore[method-assign]  # module-level __getattr__ (PEP 562)
    return module


from sglang_replayssm.cpu.standin import attention as _attention  # noqa: E402, F401  (intel_amx attention)
from sglang_replayssm.cpu.standin import ops as _ops  # noqa: E402  (registers torch.ops.sgl_kernel.*)
from sglang_replayssm.cpu.standin import spec as _spec  # noqa: E402, F401  (EAGLE / NEXTN functions)

_ops.register_all()


def _why_standin() -> str:
    """Why `sgl_kernel` resolved here: no CUDA driver (the CPU runtime), or the lab GPU switch."""
    from sglang_replayssm.cpu.driver import libcuda_loadable

    if not libcuda_loadable():
        return "sglang-replayssm CPU runtime: libcuda is not loadable, so `sgl_kernel` is the torch stand-in"
    return ("sglang-replayssm lab GPU runtime (SGLANG_REPLAYSSM_LAB_GPU=1): this torch cannot load the real "
            "`sgl_kernel`, so it is the torch stand-in")


logger.warning("%s (%d ops registered); kernels are torch references, not SGLang's.", _why_standin(),
               len(_ops.REGISTERED))


def __getattr__(attr: str):
    if attr.startswith("__"):
        raise AttributeError(attr)
    fn = _ops.PYTHON_API.get(attr)
    if fn is not None:
        return fn
    return MissingOp(f"sgl_kernel.{attr}")

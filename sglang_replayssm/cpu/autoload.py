"""Process-start hook (torch's `torch.backends` entry-point group, run at the end of `import torch`).

SGLang 0.5.23 imports `sgl_kernel` at module import time in its scheduler process, before any
SGLang plugin runs (the spawned child unpickles `run_scheduler_process`, importing the scheduler
module first). The PyPI `sgl_kernel` is CUDA-only and cannot load without libcuda. So, in a
process where libcuda cannot load, this hook routes `import sgl_kernel` to the CPU stand-in
(`sglang_replayssm.cpu.standin`), and in an SGLang server's main process it sets the environment the
CPU runtime needs before any SGLang module reads it (cpu/launch_env.py). Where libcuda loads, it does
nothing and the real package is used.
It must stay cheap: it runs in every Python process of the environment that imports torch.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys

from sglang_replayssm import settings
from sglang_replayssm.cpu.driver import libcuda_loadable

_STANDIN = "sglang_replayssm.cpu.standin"
_installed = False


def standin_wanted() -> bool:
    """The stand-in is used only without a CUDA driver, and can be switched off explicitly."""
    try:
        if not settings.CPU_RUNTIME.value():
            return False
    except ValueError:
        pass  # it runs in every process that imports torch: the plugin refuses the bad value at startup
    return not libcuda_loadable()


class _StandinFinder(importlib.abc.MetaPathFinder):
    """Resolves `sgl_kernel` and `sgl_kernel.<sub>` to the stand-in package's modules."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: D401 - importlib protocol
        if fullname != "sgl_kernel" and not fullname.startswith("sgl_kernel."):
            return None
        target_name = _STANDIN + fullname[len("sgl_kernel"):]
        return importlib.util.spec_from_loader(fullname, _AliasLoader(target_name), is_package=True)


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec):
        from sglang_replayssm.cpu.standin import submodule

        return submodule(self.target, spec.name)

    def exec_module(self, module) -> None:
        return None


def install() -> None:
    """torch.backends entry point: put the stand-in finder first on sys.meta_path when wanted, and in an
    SGLang server's main process set the environment the CPU runtime needs (cpu/launch_env.py)."""
    global _installed
    if _installed or not standin_wanted():
        return
    sys.meta_path.insert(0, _StandinFinder())
    _installed = True
    from sglang_replayssm.cpu import launch_env

    launch_env.apply()


def installed() -> bool:
    return _installed

"""CPU reference runtime: lets real SGLang 0.5.23 serve GDN/KDA hybrids on a machine without CUDA.

Active only where libcuda cannot load. It (1) routes `import sgl_kernel` to a torch stand-in
(cpu/autoload.py, run from torch's own `torch.backends` entry point at process start), (2) turns on
SGLang's CPU engine (SGLANG_USE_CPU_ENGINE=1) for the processes the server spawns, and (3) hooks
the few device paths that have no CPU implementation (cpu/hooks.py).
"""

from __future__ import annotations

import logging
import os

from sglang_replayssm.cpu.autoload import standin_wanted

logger = logging.getLogger("sglang_replayssm")


def activate() -> str:
    """Register the CPU runtime's hooks if no CUDA driver exists; return what was enabled."""
    if not standin_wanted():
        return "cpu runtime off (CUDA driver present)"
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    from sglang_replayssm.cpu import hooks, hooks_hicache, hooks_kda

    names = hooks.register() + hooks_kda.register() + hooks_hicache.register()
    return "cpu runtime ON (no CUDA driver; torch reference kernels: " + ", ".join(names) + ")"

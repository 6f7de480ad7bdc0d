"""CPU reference runtime: lets real SGLang 0.5.23 serve GDN/KDA hybrids on a machine without CUDA.

Active only where libcuda cannot load. It (1) routes `import sgl_kernel` to a torch stand-in and
sets the server's environment (SGLANG_USE_CPU_ENGINE, TRITON_INTERPRET, ...; cpu/autoload.py and
cpu/launch_env.py, run from torch's own `torch.backends` entry point at process start), (2) completes
the server flags the user did not pass, or refuses one it cannot serve (cpu/launch_args.py), and (3)
hooks the few device paths that have no CPU implementation (cpu/hooks.py, hooks_kda.py,
hooks_hicache.py). The dtype-agreement hooks (cpu/hooks_dtype.py) are registered on every device.
"""

from __future__ import annotations

import logging
import os

from sglang_replayssm.cpu.autoload import standin_wanted

logger = logging.getLogger("sglang_replayssm")


def activate() -> str:
    """Register the dtype-agreement hooks (every device) and, if no CUDA driver exists, the CPU
    runtime's hooks; return what was enabled."""
    from sglang_replayssm.cpu import hooks_dtype

    dtype_names = ", ".join(hooks_dtype.register())
    if not standin_wanted():
        return f"cpu runtime off (CUDA driver present); dtype agreement: {dtype_names}"
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    from sglang_replayssm.cpu import hooks, hooks_hicache, hooks_kda, hooks_launch, hooks_pd, hooks_spec

    names = (hooks.register() + hooks_kda.register() + hooks_hicache.register() + hooks_launch.register()
             + hooks_spec.register() + hooks_pd.register())
    return (f"cpu runtime ON (no CUDA driver; torch reference kernels: {', '.join(names)}); "
            f"dtype agreement: {dtype_names}")

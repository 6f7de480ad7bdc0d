"""`sglang-replayssm info`: versions, and what the plugin enables on this machine."""

from __future__ import annotations

from sglang_replayssm import SGLANG_PINNED_VERSION, __version__
from sglang_replayssm.cpu.autoload import libcuda_loadable, standin_wanted
from sglang_replayssm.version_check import installed_sglang_version


def main(argv: list[str]) -> int:
    found = installed_sglang_version()
    print(f"sglang-replayssm {__version__}")
    print(f"sglang {found or '(not installed)'} (pinned: {SGLANG_PINNED_VERSION}"
          f"{'' if found == SGLANG_PINNED_VERSION else ', MISMATCH: the plugin will refuse to load'})")
    print(f"CUDA driver: {'yes' if libcuda_loadable() else 'no'}")
    print(f"CPU reference runtime: {'on' if standin_wanted() else 'off'}")
    from sglang_replayssm.radix import config

    on = list(config.enabled_fixes()) if config.adapter_enabled() else []
    print(f"radix adapter: {'off' if not config.adapter_enabled() else ', '.join(on) or 'no fixes'}")
    print(f"ring decode on CUDA: {_ring_decode_path()}")
    return 0


def _ring_decode_path() -> str:
    """Which ring-decode kernels a CUDA decode batch of B >= 16 runs here (``kernels/ring_decode.pick_config``)."""
    import os
    import shutil

    import torch

    from sglang_replayssm.radix.config import cuda_kernels_enabled

    if not cuda_kernels_enabled():
        return "Triton (CUDA passes switched off by SGLANG_REPLAYSSM_CUDA_KERNELS=0)"
    if not torch.cuda.is_available():
        nvcc = shutil.which(os.environ.get("NVCC", "nvcc"))
        return f"no CUDA device here (nvcc: {nvcc or 'not found'})"
    from sglang_replayssm.kernels.ring_decode_cuda import available, cache_dir

    if available():  # builds once if needed
        return f"CUDA, one launch a layer (cache {cache_dir()}), Triton where the inputs do not fit"
    return "Triton (the CUDA passes could not be built: nvcc missing or failing, or compute capability < 8.0)"

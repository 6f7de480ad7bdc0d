"""Server flags and environment the CPU reference runtime needs (see docs/DESIGN.md)."""

from __future__ import annotations

import os


def cpu_server_env() -> dict[str, str]:
    """Environment for `python -m sglang.launch_server` on a machine without CUDA."""
    env = dict(os.environ)
    env.update({"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "TRITON_INTERPRET": "1"})
    return env


def cpu_server_args() -> list[str]:
    """Flags every CPU launch needs, beyond --model-path/--port and the arm's own flags."""
    return [
        "--device", "cpu",
        "--dtype", "float32",
        "--disable-cuda-graph",
        "--disable-overlap-schedule",
        "--skip-server-warmup",
        "--mem-fraction-static", "0.05",
        "--max-total-tokens", "16384",
        "--max-running-requests", "16",
        "--max-mamba-cache-size", "64",
    ]

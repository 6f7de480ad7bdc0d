"""Server flags the benchmark (and the tests that share its servers) choose on the CPU runtime.

Not needs: the package sets the CPU runtime's environment and completes its flags itself
(cpu/launch_env.py, cpu/launch_args.py), so a plain `python -m sglang.launch_server` works. These
are the bench's choices: fp32 (greedy agreement between arms is then exact, not precision-bound),
small pools sized for a 2-core CI machine instead of SGLang's fraction of host memory, no warmup.
"""

from __future__ import annotations


def cpu_server_args() -> list[str]:
    """The bench's precision and sizes, beyond --model-path/--port and the arm's own flags."""
    return [
        "--device", "cpu",
        "--dtype", "float32",
        "--skip-server-warmup",
        "--mem-fraction-static", "0.1",  # room for the record pool beside the capped KV pool
        "--max-total-tokens", "16384",
        "--max-running-requests", "16",
        "--max-mamba-cache-size", "64",
    ]

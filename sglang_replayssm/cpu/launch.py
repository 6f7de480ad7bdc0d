"""Server flags and environment the CPU reference runtime needs (see docs/DESIGN.md)."""

from __future__ import annotations

import json
import os


def cpu_server_env() -> dict[str, str]:
    """Environment for `python -m sglang.launch_server` on a machine without CUDA."""
    env = dict(os.environ)
    env.update({
        "SGLANG_USE_CPU_ENGINE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRITON_INTERPRET": "1",
        # fp32 models need an fp32 conv window: the default bf16 pool rounds every decode step.
        "SGLANG_MAMBA_CONV_DTYPE": "float32",
    })
    return env


def _is_kda_model(model_dir: str | os.PathLike[str] | None) -> bool:
    if model_dir is None:
        return False
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
    except OSError:
        return False
    return any("KimiLinear" in a for a in cfg.get("architectures", []))


def cpu_server_args(model_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """Flags every CPU launch needs, beyond --model-path/--port and the arm's own flags.

    Kimi-Linear's MLA layers run SGLang's Triton extend attention (interpreted) for prefill and the
    torch_native decode attention; the GDN hybrids use torch_native for both.
    """
    attention = (["--attention-backend", "triton", "--decode-attention-backend", "torch_native"]
                 if _is_kda_model(model_dir) else ["--attention-backend", "torch_native"])
    return [*attention,
        "--device", "cpu",
        "--dtype", "float32",
        "--disable-cuda-graph",
        "--skip-server-warmup",
        "--mem-fraction-static", "0.05",
        "--max-total-tokens", "16384",
        "--max-running-requests", "16",
        "--max-mamba-cache-size", "64",
    ]

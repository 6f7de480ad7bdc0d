"""The environment a CPU-runtime SGLang server needs, set by the package at process start.

Called from cpu/autoload.py (torch's `torch.backends` entry point, i.e. at the end of the first
`import torch`), which in an SGLang launch runs before any module that reads these variables:
`sglang.srt.utils.common.is_cpu()` (`SGLANG_USE_CPU_ENGINE`, read by module-level `_is_cpu = is_cpu()`
globals at import) and Triton's `@triton.jit` (`TRITON_INTERPRET`, read when a kernel is decorated).
Only the server's main process is touched (recognised by its command line: `python -m
sglang.launch_server ...` or `sglang serve ...`); the scheduler and detokenizer processes are
spawned from it and inherit its environment. A variable the user set is never overridden.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from sglang_replayssm.cpu import launch_tp

#: Always set on the CPU runtime: SGLang's CPU engine (`is_cpu()`), and Triton kernels interpreted
#: (KDA's MLA prefill runs SGLang's Triton extend attention; no compiled Triton without a GPU).
ALWAYS: dict[str, str] = {"SGLANG_USE_CPU_ENGINE": "1", "TRITON_INTERPRET": "1"}

#: What this process set (name -> value), for the one log line the plugin writes.
APPLIED: dict[str, str] = {}


def is_server_launch(argv: Sequence[str]) -> bool:
    """Whether ``argv`` (the interpreter's original command line) starts an SGLang server."""
    args = list(argv)
    for i, tok in enumerate(args[:-1]):
        if tok == "-m" and args[i + 1] in ("sglang.launch_server", "sglang.cli.main", "sglang"):
            return args[i + 1] == "sglang.launch_server" or "serve" in args[i + 2 : i + 3]
    for i, tok in enumerate(args[:2]):
        if os.path.basename(tok) == "sglang":
            return "serve" in args[i + 1 : i + 2]
    return False


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``--flag v`` or ``--flag=v`` in ``argv`` (the last one), or None."""
    value = None
    for i, tok in enumerate(argv):
        if tok == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif tok.startswith(flag + "="):
            value = tok.split("=", 1)[1]
    return value


def wanted(argv: Sequence[str]) -> dict[str, str]:
    """The variables a CPU-runtime server started with ``argv`` needs (before user overrides)."""
    env = dict(ALWAYS)
    model = flag_value(argv, "--model-path") or flag_value(argv, "--model")
    if model is not None and os.path.isdir(model):
        env["HF_HUB_OFFLINE"] = "1"  # a local model directory: never wait on the hub (no network here)
    return {**env, **launch_tp.wanted(argv, flag_value)}


def plugin_selected(environ: dict[str, str] | os._Environ[str]) -> bool:
    """Whether SGLang will run this package's `replayssm_cpu` entry point (SGLANG_PLUGINS whitelist)."""
    allowed = {x.strip() for x in environ.get("SGLANG_PLUGINS", "").split(",") if x.strip()}
    return not allowed or "replayssm_cpu" in allowed


def apply(argv: Sequence[str] | None = None) -> dict[str, str]:
    """Set the missing variables in this process if it is an SGLang server launch; returns what was set."""
    argv = list(getattr(sys, "orig_argv", sys.argv) if argv is None else argv)
    if not is_server_launch(argv) or not plugin_selected(os.environ):
        return {}
    for name, value in wanted(argv).items():
        if name not in os.environ:
            os.environ[name] = value
            APPLIED[name] = value
    return dict(APPLIED)

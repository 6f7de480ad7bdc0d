"""Start a real SGLang server on the CPU runtime for tests: `with cpu_server(model, flags) as url:`."""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from sglang_replayssm.bench.server import ServerProcess, pick_port
from sglang_replayssm.cpu.launch import cpu_server_args

#: Variables a test server must not inherit from the test process: the CPU runtime's own (the package
#: sets them in the server, as for a user; conftest.py sets TRITON_INTERPRET for in-process kernels).
_RUNTIME_ENV = ("SGLANG_USE_CPU_ENGINE", "TRITON_INTERPRET", "SGLANG_MAMBA_CONV_DTYPE", "HF_HUB_OFFLINE")


def user_env(plugins: str | None = None, env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the CPU runtime's variables, as a user's shell has it,
    plus an optional SGLANG_PLUGINS whitelist and ``env``."""
    full = {k: v for k, v in os.environ.items() if k not in _RUNTIME_ENV}
    if plugins is not None:
        full["SGLANG_PLUGINS"] = plugins
    full.update(env or {})
    return full


@contextmanager
def user_server(model_dir: Path, flags: list[str], log_path: Path, *, plugins: str | None = None,
                env: dict[str, str] | None = None, timeout_s: float = 300.0) -> Iterator[str]:
    """A plain `python -m sglang.launch_server --model-path <dir> --host --port <flags>` (only the
    user's flags, no launcher), healthy for the body of the `with`; stopped (process group) after."""
    port = pick_port()
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir), "--host", "127.0.0.1",
           "--port", str(port), *flags]
    with ServerProcess(cmd, user_env(plugins, env), log_path, f"http://127.0.0.1:{port}", timeout_s):
        yield f"http://127.0.0.1:{port}"


@contextmanager
def cpu_server_process(model_dir: Path, flags: list[str], log_path: Path, *,
                       plugins: str = "replayssm_cpu,replayssm_radix", env: dict[str, str] | None = None,
                       timeout_s: float = 240.0) -> Iterator[ServerProcess]:
    """`cpu_server`, yielding the :class:`ServerProcess` (its ``base_url``; :func:`crash` kills it)."""
    port = pick_port()
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir), "--host", "127.0.0.1",
           "--port", str(port), *cpu_server_args(), *flags]
    with ServerProcess(cmd, user_env(plugins, env), log_path, f"http://127.0.0.1:{port}", timeout_s) as srv:
        yield srv


def crash(srv: ServerProcess) -> None:
    """SIGKILL the server's whole process group (HTTP server, scheduler, detokenizer) at once: no
    shutdown path runs, files being written stay as they are."""
    assert srv.proc is not None
    os.killpg(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait(timeout=30)


@contextmanager
def cpu_server(model_dir: Path, flags: list[str], log_path: Path, *, plugins: str = "replayssm_cpu,replayssm_radix",
               env: dict[str, str] | None = None, timeout_s: float = 240.0) -> Iterator[str]:
    """`user_server` with the bench's choices first (fp32, small pools, no warmup: cpu/launch.py)."""
    with user_server(model_dir, [*cpu_server_args(), *flags], log_path, plugins=plugins, env=env,
                     timeout_s=timeout_s) as url:
        yield url


def generate(url: str, input_ids: list[int], max_new_tokens: int, timeout_s: float = 300.0,
             top_logprobs: int = 0) -> dict:
    """Greedy /generate for one prompt; returns {'output_ids': [...], 'cached_tokens': int} and, with
    ``top_logprobs=k``, 'logprobs' (the chosen token's logprob per step) and 'top' (per step a dict
    token id -> logprob of the k most likely tokens)."""
    payload: dict = {"input_ids": input_ids,
                     "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}}
    if top_logprobs:
        payload.update(return_logprob=True, top_logprobs_num=top_logprobs, logprob_start_len=len(input_ids))
    req = urllib.request.Request(url + "/generate", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        out = json.loads(resp.read())
    result = {"output_ids": out["output_ids"], "cached_tokens": out["meta_info"]["cached_tokens"]}
    if top_logprobs:
        meta = out["meta_info"]
        result["logprobs"] = [float(e[0]) for e in meta["output_token_logprobs"]]
        result["top"] = [{int(e[1]): float(e[0]) for e in step} for step in meta["output_top_logprobs"]]
    return result


def generate_batch(url: str, prompts: list[list[int]], max_new_tokens: int) -> list[dict]:
    """The prompts sent concurrently (so the scheduler batches them); results in prompt order."""
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        return list(pool.map(lambda p: generate(url, p, max_new_tokens), prompts))

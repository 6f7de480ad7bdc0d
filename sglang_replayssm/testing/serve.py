"""Start a real SGLang server on the CPU runtime for tests: `with cpu_server(model, flags) as url:`."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from sglang_replayssm.bench.server import ServerProcess, pick_port
from sglang_replayssm.cpu.launch import cpu_server_args, cpu_server_env


@contextmanager
def cpu_server(model_dir: Path, flags: list[str], log_path: Path, *, plugins: str = "replayssm_cpu,replayssm_radix",
               env: dict[str, str] | None = None, timeout_s: float = 240.0) -> Iterator[str]:
    """A healthy server on 127.0.0.1 for the body of the `with`; stopped (whole process group) after."""
    port = pick_port()
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir), "--host", "127.0.0.1",
           "--port", str(port), *cpu_server_args(model_dir), *flags]
    full_env = cpu_server_env()
    full_env["SGLANG_PLUGINS"] = plugins
    full_env.update(env or {})
    with ServerProcess(cmd, full_env, log_path, f"http://127.0.0.1:{port}", timeout_s):
        yield f"http://127.0.0.1:{port}"


def generate(url: str, input_ids: list[int], max_new_tokens: int, timeout_s: float = 300.0) -> dict:
    """Greedy /generate for one prompt; returns {'output_ids': [...], 'cached_tokens': int}."""
    body = json.dumps({"input_ids": input_ids,
                       "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0,
                                           "ignore_eos": True}}).encode()
    req = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        out = json.loads(resp.read())
    return {"output_ids": out["output_ids"], "cached_tokens": out["meta_info"]["cached_tokens"]}


def generate_batch(url: str, prompts: list[list[int]], max_new_tokens: int) -> list[dict]:
    """The prompts sent concurrently (so the scheduler batches them); results in prompt order."""
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        return list(pool.map(lambda p: generate(url, p, max_new_tokens), prompts))

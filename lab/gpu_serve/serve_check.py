"""The GPU serving check: per arm, one real SGLang server, then the stages that arm is in.

    python lab/gpu_serve/serve_check.py --model-path M --out DIR [--arms a,b] [--stages main,kl,decode]

Stages, each against the arm's one server (``sglang_replayssm.bench``; ``profile``: profile_step.py):
  main    the shared-prefix bench (gsp, then RAG) through ``sglang-replayssm bench --url``:
          hit rate beside the attention-only ceiling, TTFT p50 / p90, e2e (a /flush_cache between)
  kl      teacher-forced KL / |delta logprob| of served continuations (bench/kl.py)
  decode  output tokens/s and SGLang's per-step time at each --decode-concurrency (bench/decode.py)
  profile a torch-profiler trace of full-batch decode steps summed by kernel family (not by default)
  ttft    a prefix hit's TTFT in parts: seed, branch (a hit), cold, floor; one branch and one cold traced
Writes DIR/serve_check.json after every arm, DIR/tables.md at the end, server logs in DIR/logs/.
Arms are skipped (and said so) once less than --min-arm-s of --budget-s is left.
``--lab`` adds the lab H200's flags (its torch cannot load the real sgl_kernel: Triton attention,
torch sampling); scripts/gpu_serve.sh passes it. A user's GPU box runs without it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from sglang_replayssm.bench.arms import (
    ARMS,
    command_line,
    merge_flags,
    parse_arms,
    server_command,
    server_env,
)
from sglang_replayssm.bench.decode import run_decode
from sglang_replayssm.bench.kl import SCENARIOS, KlSpec, run_kl
from sglang_replayssm.bench.server import ServerProcess, ServerStartError, pick_port

# The lab's flags: Triton attention and torch sampling (no flashinfer / sgl_kernel there), and no prefill
# CUDA graphs (at qnext-gdn's size the stand-in's breakable prefill graphs took ~24 s and ~5.7 GB per
# shape, 58 shapes: out of memory and out of time). Decode CUDA graphs stay on.
LAB_FLAGS = ("--attention-backend triton --sampling-backend pytorch --disable-custom-all-reduce "
             "--disable-prefill-cuda-graph")


PREFILL_GRAPH_HELP = ("keep SGLang's prefill CUDA graphs on (its CUDA default). Its default buckets (4 to "
                      "--chunked-prefill-size tokens) replay every prefill; a bucket pads at most 2x, so buckets bounded "
                      "with --cuda-graph-bs-prefill 1024 ... leave prefills under 512 tokens eager")


def lab_flags(prefill_graph: bool = False) -> list[str]:
    """:data:`LAB_FLAGS` as a list; ``prefill_graph``: without ``--disable-prefill-cuda-graph`` (SGLang's default)."""
    return [f for f in shlex.split(LAB_FLAGS) if not (prefill_graph and f == "--disable-prefill-cuda-graph")]


# Serving sizes: up to 256 running requests with CUDA graphs; extra_buffer + ring take ~5 mamba slots
# per running request.
SERVE_FLAGS = ("--max-running-requests 256 --cuda-graph-bs-decode 1 2 4 8 16 32 64 128 256 "
               "--max-mamba-cache-size 1400 --chunked-prefill-size 8192 --mem-fraction-static 0.85")
# Prompts of 2-8K tokens: gsp system prompts 4,096 + questions of 128-512; RAG: a 1,000-token system
# prompt, documents of 1,500-4,500 tokens (off the 64-token grid), two turns. One request at a time, as
# `make bench`: the attention-only ceiling assumes every earlier prompt is cached when a request is sent,
# which requests prefilled in one batch cannot see (concurrency is the decode stage's job).
GSP_ARGS = ("--dataset-name generated-shared-prefix --gsp-num-groups 4 --gsp-prompts-per-group 8 "
            "--gsp-system-prompt-len 4096 --gsp-question-len 512 --gsp-range-ratio 0.25 --gsp-output-len 32 "
            "--max-concurrency 1")
RAG_ARGS = ("--dataset-name rag --rag-num-docs 4 --rag-doc-len 3000 --gsp-range-ratio 0.5 "
            "--rag-system-prompt-len 1000 --rag-num-conversations 16 --rag-num-turns 2 --rag-question-len 128 "
            "--rag-output-len 32 --max-concurrency 1")
# The same shape with 16K-token system prompts: at qnext-gdn's size (8 layers) a 2-8K prefill is a few
# ms beside a ~45 ms fixed TTFT (H200, 2026-12-03), so hits can only show in TTFT at longer prompts.
GSP_LONG_ARGS = ("--dataset-name generated-shared-prefix --gsp-num-groups 3 --gsp-prompts-per-group 5 "
                 "--gsp-system-prompt-len 16384 --gsp-question-len 512 --gsp-range-ratio 0.25 --gsp-output-len 16 "
                 "--max-concurrency 1")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--arms", default="baseline,upstream,plugin,plugin-bf16,plugin-fp8,bf16-state")
    p.add_argument("--stages", default="main,kl,decode")
    p.add_argument("--main-arms", default="baseline,upstream,plugin,plugin-fp8",
                   help="arms that run the main stage (others skip it)")
    p.add_argument("--kl-arms", default="baseline,plugin,plugin-bf16,plugin-fp8")
    p.add_argument("--kl-scenarios", default="decode,exact,rebuilt", help=f"of {','.join(SCENARIOS)}")
    p.add_argument("--kl-decode-tokens", type=int, default=512)
    p.add_argument("--kl-probes", type=int, default=4)
    p.add_argument("--decode-concurrency", default="64,256")
    p.add_argument("--decode-prompt-len", type=int, default=512)
    p.add_argument("--decode-output-len", type=int, default=256)
    p.add_argument("--profile-arms", default="baseline,plugin,plugin-fp8",
                   help="arms whose decode step is profiled (stage profile)")
    p.add_argument("--profile-concurrency", type=int, default=256)
    p.add_argument("--ttft-profile", action="store_true",
                   help="ttft stage: also trace one floor and one cold prefill (kernels, launches, CPU ops)")
    p.add_argument("--ttft-prefix-len", type=int, default=3332,
                   help="ttft stage: the branch's hit depth (3,332: 4 records past an interval state; 3,500: 172)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--lab", action="store_true", help="the lab H200's flags (scripts/gpu_serve.sh)")
    p.add_argument("--server-args", default="", help="extra server flags for every arm")
    p.add_argument("--prefill-graph", action="store_true", help=f"with --lab: {PREFILL_GRAPH_HELP}")
    p.add_argument("--gsp-args", default=GSP_ARGS)
    p.add_argument("--rag-args", default=RAG_ARGS)
    p.add_argument("--gsp-long-args", default=GSP_LONG_ARGS)
    p.add_argument("--main-workloads", default="gsp,rag", help="of gsp, rag, gsp-long")
    p.add_argument("--variant", action="append", default=[],
                   help="NAME=BASE:VAR=VALUE[,VAR=VALUE]: an arm BASE with environment variables added (decode_ab.py)")
    p.add_argument("--budget-s", type=float, default=540.0)
    p.add_argument("--min-arm-s", type=float, default=110.0)
    p.add_argument("--start-timeout-s", type=float, default=300.0)
    return p


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _ttft_floor(url: str, n: int = 9, prompt_len: int = 32) -> dict[str, Any]:
    """TTFT of a short uncached prompt, one at a time: what every request pays before its prefill's tokens
    (HTTP, tokenizer-free scheduling, one small forward, the first token back). The main job's TTFT above it
    is what prefix hits can save."""
    import asyncio
    import random

    import aiohttp

    from sglang_replayssm.bench.client import generate
    from sglang_replayssm.bench.metrics import percentile
    from sglang_replayssm.bench.records import RequestRecord

    async def go() -> list[float]:
        rng = random.Random(11)
        out: list[float] = []
        async with aiohttp.ClientSession() as session:
            for _ in range(n):
                rec = RequestRecord(rid="floor", conversation=0, turn=0, group=0)
                ids = [rng.randrange(10, 2000) for _ in range(prompt_len)]
                await generate(session, url, ids, 2, rec, time.perf_counter())
                if rec.ttft_s is not None:
                    out.append(rec.ttft_s)
        return out[1:]  # the first pays first-use costs

    ttfts = asyncio.run(go())
    return {"prompt_len": prompt_len, "requests": len(ttfts), "ttft_p50_s": percentile(ttfts, 50.0),
            "ttft_p90_s": percentile(ttfts, 90.0)}


def _main_stage(url: str, arm: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    import asyncio

    from sglang_replayssm.bench import cli as bench_cli
    from sglang_replayssm.bench.client import post

    res: dict[str, Any] = {"ttft_floor": _ttft_floor(url)}
    workloads = {"gsp": args.gsp_args, "rag": args.rag_args, "gsp-long": args.gsp_long_args}
    for ds in _csv(args.main_workloads):
        extra = workloads[ds]
        asyncio.run(post(url, "/flush_cache"))
        path = out / f"main-{ds}-{arm}.json"
        argv = ["--url", url, "--arms", arm, "--model-path", str(args.model_path), "--json", str(path),
                "--disable-tqdm", "--flush-cache", *shlex.split(extra)]
        rc = bench_cli.main(argv)
        doc = json.loads(path.read_text()) if path.exists() else {}
        a = doc.get("arms", {}).get(arm, {})
        keep = ("hit_rate", "ceiling_hit_rate", "hit_rate_server", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s",
                "e2e_p50_s", "e2e_p90_s", "output_tok_s", "requests_ok", "requests_failed", "prompt_tokens",
                "cached_tokens")
        res[ds] = {"rc": rc, **{k: a.get(k) for k in keep},
                   "output_ids": [r.get("output_ids") for r in a.get("requests", [])],
                   "workload": doc.get("workload"), "error": doc.get("error") or doc.get("failed_arms")}
    return res


def _log_facts(log: Path) -> dict[str, Any]:
    """Memory and configuration lines of the server log worth keeping beside the numbers."""
    keys = ("KV Cache is allocated", "Mamba Cache is allocated", "Memory pool end", "record pool",
            "sglang-replayssm", "Capture cuda graph end", "max_total_num_tokens", "Traceback", "Error")
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return {"lines": [ln[-300:] for ln in lines if any(k in ln for k in keys)][:40]}


def run_arm(name: str, args: argparse.Namespace, doc: dict[str, Any], t_end: float) -> None:
    arm = ARMS[name]
    stages = _csv(args.stages)
    # --server-args first: a flag given there wins over the lab and serving defaults.
    lab = lab_flags(args.prefill_graph)
    extra = merge_flags(shlex.split(args.server_args), (lab if args.lab else []) + shlex.split(SERVE_FLAGS))
    port = pick_port()
    cmd = server_command(arm, args.model_path, port, device=args.device, tp=1, extra_args=extra)
    env = server_env(arm, args.device)
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"server-{name}.log"
    entry: dict[str, Any] = {"server_cmd": command_line(cmd, env), "stages": {}}
    doc["arms"][name] = entry
    print(f"[{name}] {arm.description}\n[{name}] {entry['server_cmd']}", flush=True)
    t0 = time.monotonic()
    start_s = min(args.start_timeout_s, max(30.0, t_end - time.monotonic() - 30))
    try:
        with ServerProcess(cmd, env, log, f"http://127.0.0.1:{port}", start_s) as srv:
            entry["startup_s"] = srv.startup_s
            print(f"[{name}] healthy after {srv.startup_s:.0f} s", flush=True)
            healthy_at = time.time()
            url = srv.base_url
            # KL first: its rebuilds and decodes also warm what the main job's TTFT would pay for once.
            if "kl" in stages and name in _csv(args.kl_arms) and time.monotonic() < t_end:
                spec = KlSpec(probes=args.kl_probes, decode_tokens=args.kl_decode_tokens)
                entry["stages"]["kl"] = run_kl(url, spec, _csv(args.kl_scenarios))
            if "main" in stages and name in _csv(args.main_arms) and time.monotonic() < t_end:
                entry["stages"]["main"] = _main_stage(url, name, args, args.out)
            if "decode" in stages and time.monotonic() < t_end:
                entry["stages"]["decode"] = []
                for c in _csv(args.decode_concurrency):
                    if time.monotonic() < t_end:  # a short unmeasured burst first (first-use costs)
                        run_decode(url, int(c), args.decode_prompt_len, 24, seed=5)
                        entry["stages"]["decode"].append(
                            run_decode(url, int(c), args.decode_prompt_len, args.decode_output_len, log_path=log))
            if "ttft" in stages and time.monotonic() < t_end:
                from profile_step import ttft_parts

                try:
                    entry["stages"]["ttft"] = ttft_parts(url, args.out / "profiles" / name,
                                                         prefix_len=args.ttft_prefix_len, profile=args.ttft_profile)
                    print(f"[{name}] ttft parts (ms): {entry['stages']['ttft']['median_ms']} cached "
                          f"{entry['stages']['ttft']['cached_tokens'].get('branch')}", flush=True)
                except (OSError, RuntimeError, ValueError) as exc:  # urllib's errors are OSErrors
                    entry["stages"]["ttft"] = {"error": str(exc)[-500:]}
            if "profile" in stages and name in _csv(args.profile_arms) and time.monotonic() < t_end:
                from profile_step import profile_decode

                entry["stages"]["profile"] = profile_decode(
                    url, args.out / "profiles" / name, log, args.profile_concurrency, args.decode_prompt_len,
                    args.decode_output_len)
            entry["serving_compiles"] = _serving_compiles(name, healthy_at)
    except (ServerStartError, RuntimeError, OSError) as exc:
        entry["error"] = str(exc)[-3000:]
        if start_s < args.start_timeout_s and "startup_s" not in entry and time.monotonic() - t0 >= start_s:
            entry["error"] = f"cut by the budget: not healthy within {start_s:.0f} s"  # not the server's fault
            print(f"[{name}] {entry['error']} (log: {log.name})", flush=True)
        else:
            print(f"[{name}] FAILED: {str(exc)[-1500:]}", flush=True)
    entry["wall_s"] = time.monotonic() - t0
    entry["log_facts"] = _log_facts(log)


def _serving_compiles(name: str, since: float) -> dict[str, Any] | None:
    """The Triton variants the arm's server built while serving (``LAB_COMPILE_LOG``, the lab shim), printed."""
    path = os.environ.get("LAB_COMPILE_LOG", "")
    if not path:
        return None
    from lab_compile_log import serving_compiles  # the shim, on PYTHONPATH

    got = serving_compiles(path, since, time.time())
    print(f"[{name}] Triton compiles while serving: ours {len(got['ours'])} "
          f"({sum(ms for ms, _ in got['ours']):.0f} ms: {sorted({k for _, k in got['ours']})}), SGLang's "
          f"{len(got['sglang'])} ({sum(ms for ms, _ in got['sglang']):.0f} ms)", flush=True)
    return got


def tables(doc: dict[str, Any]) -> str:
    from lab_tables import tables as render  # beside this file

    return render(doc)


def _drop_traces(out: Path) -> None:
    """Profiler traces are summarised in the JSON; the raw ones are too big to bring back."""
    for trace in out.glob("profiles/*/*.trace.json*"):
        trace.unlink()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    t_end = time.monotonic() + args.budget_s
    from decode_ab import add_variant  # beside this file

    for spec in args.variant:
        add_variant(spec)
    doc: dict[str, Any] = {"model_path": str(args.model_path), "argv": sys.argv[1:], "arms": {}, "skipped": []}
    for name in parse_arms(args.arms):
        left = t_end - time.monotonic()
        if left < args.min_arm_s:
            doc["skipped"].append(name)
            print(f"[{name}] skipped: {left:.0f} s of the budget left", flush=True)
            continue
        run_arm(name, args, doc, t_end)
        _drop_traces(args.out)
        (args.out / "serve_check.json").write_text(json.dumps(doc, indent=1))
        (args.out / "tables.md").write_text(tables(doc))
    text = tables(doc)
    (args.out / "tables.md").write_text(text)
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(main())

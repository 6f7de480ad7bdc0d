"""Where one served decode step goes: a torch-profiler trace of a full batch, summed by kernel family.

``profile_decode`` sends ``concurrency`` long decodes (bench/decode.py's burst), waits until the
server's log shows the whole batch decoding, asks SGLang for ``num_steps`` profiled steps
(``/start_profile``, CPU + GPU activities) and, after the burst, reads the trace it wrote:
GPU kernel time per family (``FAMILIES``, first match wins), the linear-attention share, and the host
synchronisations the CUDA runtime saw (``cudaStreamSynchronize`` and the like) per step.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

from sglang_replayssm.bench.decode import decode_steps, run_decode

FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("plugin CUDA passes", ("ring_step_kernel", "flush_kernel", "read_kernel", "flush_rows_kernel",
                            "flush_pipe_kernel")),
    ("plugin Triton", ("ring_decode_kernel", "ring_read_rows_kernel", "read_copy_decode_kernel", "_refresh_kernel",
                       "_cursor_step_kernel", "materialize_kernel")),
    ("SGLang linear attention", ("fused_recurrent", "gated_delta", "chunk_", "kda", "fused_sigmoid_gating",
                                 "causal_conv1d", "conv1d", "packed_decode", "fused_gdn")),
    ("attention", ("decode_attention", "extend_attention", "_fwd_kernel", "attn", "mla")),
    ("GEMM", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "sm90_", "splitk")),
)
LINEAR = ("plugin CUDA passes", "plugin Triton", "SGLang linear attention")
SYNC_NAMES = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy ")


def family(kernel: str) -> str:
    low = kernel.lower()
    for fam, keys in FAMILIES:
        if any(k.lower() in low for k in keys):
            return fam
    return "other"


def summarize_trace(path: Path, steps: int) -> dict[str, Any]:
    """Kernel microseconds per family (per step), the linear-attention share, host syncs per step."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = json.load(f).get("traceEvents", [])
    per_family: dict[str, float] = defaultdict(float)
    per_kernel: dict[str, float] = defaultdict(float)
    syncs: dict[str, int] = defaultdict(int)
    sync_events: list[dict[str, Any]] = []
    frames: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    spans: list[tuple[float, float]] = []
    cpu_ops: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # name -> [calls, us]
    launches = 0
    for ev in events:
        cat, name = ev.get("cat", ""), ev.get("name", "")
        if cat == "cpu_op":
            cpu_ops[name[:80]][0] += 1
            cpu_ops[name[:80]][1] += float(ev.get("dur", 0.0))
        elif cat == "cuda_runtime" and "Launch" in name:
            launches += 1
        if cat == "kernel":
            spans.append((float(ev.get("ts", 0.0)), float(ev.get("ts", 0.0)) + float(ev.get("dur", 0.0))))
            per_family[family(name)] += float(ev.get("dur", 0.0))
            per_kernel[name[:120]] += float(ev.get("dur", 0.0))
        elif cat == "cuda_runtime" and any(name.startswith(s.strip()) for s in SYNC_NAMES):
            syncs[name] += 1
            sync_events.append(ev)
        elif cat == "python_function":
            frames[ev.get("tid")].append(ev)
    total = sum(per_family.values())
    # Where the syncs come from (with_stack traces): the innermost Python frame of ours or SGLang's.
    where: dict[str, int] = defaultdict(int)
    for ev in sync_events:
        t = float(ev.get("ts", 0.0))
        inside = [f for f in frames.get(ev.get("tid"), []) if f["ts"] <= t <= f["ts"] + f.get("dur", 0.0)
                  and ("sglang" in f.get("name", ""))]
        inner = min(inside, key=lambda f: f.get("dur", 0.0), default=None)
        where[(inner or {}).get("name", "?")[-110:]] += 1
    steps = max(steps, 1)
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:15]
    host = host_frames(frames, steps)
    busy, span = gpu_busy(spans)
    return {
        "trace": path.name, "steps": steps, "kernel_us_per_step": total / steps,
        "gpu_busy_us_per_step": busy / steps, "gpu_span_us_per_step": span / steps,
        "family_us_per_step": {k: v / steps for k, v in sorted(per_family.items(), key=lambda kv: -kv[1])},
        "linear_share": sum(per_family[f] for f in LINEAR) / total if total else float("nan"),
        "plugin_cuda_us_per_step": per_family["plugin CUDA passes"] / steps,
        "host_syncs_per_step": {k: v / steps for k, v in syncs.items()},
        "host_sync_sites_per_step": {k: v / steps for k, v in sorted(where.items(), key=lambda kv: -kv[1])[:20]},
        "top_kernels_us_per_step": [(k, v / steps) for k, v in top],
        "kernels_per_step": len(spans) / steps, "launches_per_step": launches / steps,
        "top_cpu_ops_per_step": [(k, c / steps, us / steps) for k, (c, us) in
                                 sorted(cpu_ops.items(), key=lambda kv: -kv[1][1])[:20]],
        **host,
    }


def gpu_busy(spans: list[tuple[float, float]]) -> tuple[float, float]:
    """(time some kernel runs, first start to last end) over kernel ``(start, end)`` spans: their
    gap is the GPU idle inside the profiled window (host-bound steps, waits between streams)."""
    if not spans:
        return 0.0, 0.0
    spans = sorted(spans)
    busy, (lo, hi) = 0.0, spans[0]
    for a, b in spans[1:]:
        if a > hi:
            busy, lo, hi = busy + hi - lo, a, b
        else:
            hi = max(hi, b)
    return busy + hi - lo, max(b for _, b in spans) - spans[0][0]


def host_frames(frames: dict[Any, list[dict[str, Any]]], steps: int, top: int = 12) -> dict[str, Any]:
    """Host time per step: the plugin's outermost Python frames, and SGLang's busiest frames.

    ``plugin_host_us_per_step`` sums the frames of ``sglang_replayssm`` not nested in another frame
    of ours (inclusive time, on every thread); ``plugin_host_frames`` lists them by name.
    ``plugin_host_frames_any_depth``: every frame of ours by inclusive time (nested ones overlap).
    ``sglang_host_frames`` lists SGLang's frames by inclusive time (nested ones overlap: read it as a
    call tree). with_stack tracing slows the host, so compare arms, not absolute numbers.
    """
    ours: dict[str, float] = defaultdict(float)
    inner: dict[str, float] = defaultdict(float)
    theirs: dict[str, float] = defaultdict(float)
    for evs in frames.values():
        stack: list[tuple[float, bool]] = []  # (end, inside a frame of ours)
        for ev in sorted(evs, key=lambda e: (float(e.get("ts", 0.0)), -float(e.get("dur", 0.0)))):
            ts, dur, name = float(ev.get("ts", 0.0)), float(ev.get("dur", 0.0)), str(ev.get("name", ""))
            while stack and stack[-1][0] < ts:
                stack.pop()
            mine = "sglang_replayssm" in name
            inside = bool(stack) and stack[-1][1]
            if mine:
                inner[name[-100:]] += dur
            if mine and not inside:
                ours[name[-100:]] += dur
            elif "sglang/srt" in name and not inside:
                theirs[name[-100:]] += dur
            stack.append((ts + dur, inside or mine))
    steps = max(steps, 1)
    return {
        "plugin_host_us_per_step": sum(ours.values()) / steps,
        "plugin_host_frames": [(k, v / steps) for k, v in sorted(ours.items(), key=lambda kv: -kv[1])[:top]],
        "plugin_host_frames_any_depth": [(k, v / steps) for k, v in sorted(inner.items(), key=lambda kv: -kv[1])[:36]],
        "sglang_host_frames": [(k, v / steps) for k, v in sorted(theirs.items(), key=lambda kv: -kv[1])[:2 * top]],
    }


def profile_decode(url: str, out_dir: Path, log_path: Path, concurrency: int, prompt_len: int, output_len: int,
                   num_steps: int = 10, wait_s: float = 120.0) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {}
    burst = threading.Thread(target=lambda: result.update(
        run_decode(url, concurrency, prompt_len, output_len, log_path=log_path, seed=11)))
    start = log_path.stat().st_size
    burst.start()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and burst.is_alive():
        with open(log_path, errors="replace") as f:
            f.seek(start)
            if decode_steps(f.read(), concurrency):
                break
        time.sleep(0.5)
    body = json.dumps({"output_dir": str(out_dir), "num_steps": num_steps, "activities": ["CPU", "GPU"],
                       "with_stack": True}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/start_profile", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        resp.read()
    burst.join()
    traces: list[Path] = []
    for _ in range(60):  # the trace is written after the last profiled step
        traces = sorted(out_dir.glob("*.trace.json*"))
        if traces:
            break
        time.sleep(1.0)
    if not traces:
        return {"error": f"no trace under {out_dir}", "burst": result}
    time.sleep(2.0)
    return {"burst": result, **summarize_trace(traces[-1], num_steps)}


def _generate(url: str, ids: list[int], new: int) -> dict[str, Any]:
    body = json.dumps({"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": new,
                                                             "ignore_eos": True}}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/generate", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=60) as resp:
        out = json.loads(resp.read())
    out["client_s"] = time.perf_counter() - t0
    return out


def _stream_ttft_ms(url: str, ids: list[int], new: int) -> float:
    """Client time (ms) to the first streamed token of a greedy ``/generate``, taken by the main job's
    client (``bench.client.generate``), so it is the TTFT the main job reports."""
    import asyncio

    import aiohttp

    from sglang_replayssm.bench.client import generate
    from sglang_replayssm.bench.records import RequestRecord

    async def one() -> RequestRecord:
        async with aiohttp.ClientSession() as session:
            rec = RequestRecord(rid="ttft", conversation=0, turn=0, group=0)
            return await generate(session, url.rstrip("/"), ids, new, rec, time.perf_counter())

    rec = asyncio.run(one())
    if rec.ttft_s is None:
        raise RuntimeError(f"streamed request failed: {rec.error}")
    return round(1e3 * rec.ttft_s, 2)


def _post_json(url: str, path: str, payload: dict[str, Any]) -> None:
    req = urllib.request.Request(url.rstrip("/") + path, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        resp.read()


def ttft_parts(url: str, out_dir: Path, prefix_len: int = 3332, suffix_len: int = 150, reps: int = 5,
               profile: bool = False) -> dict[str, Any]:
    """Where a prefix hit's TTFT goes, one request at a time (max_new_tokens 1: the request's time is its
    prefill). Per repetition, on a fresh prefix: a seed (prefix + suffix A, cold), a branch (prefix + suffix B:
    a hit at ``prefix_len``, which the plugin rebuilds from records and SGLang resumes from its last state)
    and a cold prompt of the branch's length; beside them a 32-token cold prompt (the fixed floor).
    Medians of the client's request time. With ``profile``, a floor, a branch and a cold prompt (one each) are
    traced (SGLang's /start_profile from the request's arrival to /stop_profile after its answer, with Python
    stacks) and summarized like a decode step (off by default): kernels, launches, CPU ops, host syncs and the
    plugin's host frames of one floor, one branch (a hit) and one cold prefill, and of one branch streamed with 32
    new tokens (``branch32``: its first token waits on the first decode step's launch)."""
    import random

    rng = random.Random(5)

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, 2000) for _ in range(n)]

    times: dict[str, list[float]] = defaultdict(list)
    cached: dict[str, list[int]] = defaultdict(list)
    for rep in range(reps + 1):
        prefix = ids(prefix_len)
        got = {"seed": _generate(url, prefix + ids(suffix_len), 1),
               "branch": _generate(url, prefix + ids(suffix_len), 1),
               "cold": _generate(url, ids(prefix_len + suffix_len), 1),
               "floor": _generate(url, ids(32), 1)}
        if rep == 0:
            continue  # first-use costs
        for k, v in got.items():
            times[k].append(v["client_s"])
            cached[k].append(int(v.get("meta_info", {}).get("cached_tokens", 0)))
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    res: dict[str, Any] = {"prefix_len": prefix_len, "suffix_len": suffix_len, "reps": reps,
                           "median_ms": {k: 1e3 * v for k, v in med.items()}, "cached_tokens": dict(cached),
                           "all_ms": {k: [round(1e3 * x, 2) for x in v] for k, v in times.items()}}
    if profile:
        for kind in ("floor", "branch", "cold", "branch32"):
            d = out_dir / f"prefill-{kind}"
            d.mkdir(parents=True, exist_ok=True)
            prefix = ids(prefix_len)
            _generate(url, prefix + ids(suffix_len), 1)  # the seed: the branch's hit
            traced = {"floor": ids(32), "branch": prefix + ids(suffix_len), "cold": ids(prefix_len + suffix_len),
                      "branch32": prefix + ids(suffix_len)}
            _post_json(url, "/start_profile", {"output_dir": str(d), "num_steps": 1, "activities": ["CPU", "GPU"],
                                               "with_stack": True})
            if kind == "branch32":  # streamed, 32 new tokens: the prefill, its first token and the decode steps
                res["branch32_ttft_ms"] = _stream_ttft_ms(url, traced[kind], 32)
            else:
                _generate(url, traced[kind], 1)
            # SGLang stops a num_steps profile only when a later batch runs: none does after this one request
            try:
                _post_json(url, "/stop_profile", {})
            except urllib.error.HTTPError:  # already stopped: the trace is being written
                pass
            traces: list[Path] = []
            for _ in range(30):
                traces = sorted(d.glob("*.trace.json*"))
                if traces:
                    break
                time.sleep(1.0)
            time.sleep(2.0)
            res[f"profile_{kind}"] = summarize_trace(traces[-1], 1) if traces else {"error": f"no trace under {d}"}
    return res

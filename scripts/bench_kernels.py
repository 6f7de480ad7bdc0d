#!/usr/bin/env python3
"""Decode-kernel benchmark on one GPU: our ring decode vs SGLang 0.5.23's kernels vs memory floors.

One run prints (markdown) and writes as JSON, for GDN (Qwen3-Next: H=16, HV=32, K=V=128) and KDA
(Kimi-Linear: H=HV=32, K=V=128), fp32 state, bf16 inputs/outputs, L=16, B in {1, 64, 256, 512}:

* ours (``ring_decode_triton``): best launch config of a small sweep, and ``pick_config``'s default;
  per-step time averaged over one full ring window (15 non-flush steps + 1 flush, every row at the
  same cursor, exactly as docs in shared/gpu-baselines.md measured SGLang);
* SGLang's ReplaySSM kernel (same window), SGLang's packed decode (GDN Triton; KDA Triton and the
  CUDA row-streaming kernel built from SGLang's header with nvcc + tvm_ffi);
* floors from the same run: a device-to-device copy of the state pool (read+write floor), half of
  it (read-only floor), and a Triton read-only kernel (achievable read bandwidth);
* materialize (helper kernel ``kernels.materialize_triton``, if present) at B=256 vs its bytes floor;
* a CUDA-graph check: one decode step (device cursor step + our kernel) captured, replayed for
  2L+8 steps, compared bit for bit with eager; eager steps run under
  ``torch.cuda.set_sync_debug_mode("error")`` (any host sync raises).

Timing: each measured callable is captured in a CUDA graph (no Python launch overhead) and the
median over repeated replays is taken (falls back to eager launches if capture fails; the JSON
records which). Performance is reported, never asserted.

Usage: ``python scripts/bench_kernels.py --sglang-root DIR [--out DIR] [--quick]``
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_replayssm.kernels.cursor import cursor_step_triton  # noqa: E402
from sglang_replayssm.kernels.ring_decode_slices import ring_read_rows_kernel  # noqa: E402
from sglang_replayssm.kernels.ring_decode_triton import (  # noqa: E402
    _ring_decode_kernel,
    pick_config,
    ring_decode_triton,
)

MODELS = {
    "gdn": {"H": 16, "HV": 32, "K": 128, "V": 128, "is_kda": False},
    "kda": {"H": 32, "HV": 32, "K": 128, "V": 128, "is_kda": True},
}
L_RING = 16


def log(*a: object) -> None:
    print(*a, flush=True)


# ----------------------------------------------------------------------------- timing


def time_us(
    fn: Callable[[], object], *, n_meas: int = 9, target_ms: float = 3.0, graph: bool = True
) -> tuple[float, str]:
    """Median microseconds per call of ``fn`` over CUDA-graph replays (or eager launches)."""
    cur = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        fn()
        fn()
    cur.wait_stream(side)
    torch.cuda.synchronize()
    method = "graph"
    try:
        if not graph:
            raise RuntimeError("eager timing requested")
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            fn()
        run = cuda_graph.replay
    except Exception as e:  # some launchers cannot be captured
        if graph:
            log(f"    (graph capture failed: {type(e).__name__}: {str(e)[:120]}; timing eager launches)")
        torch.cuda.synchronize()
        method = "eager"
        run = fn  # type: ignore[assignment]
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    run()
    e1.record()
    torch.cuda.synchronize()
    est_ms = max(e0.elapsed_time(e1), 1e-3)
    inner = max(2, min(2000, int(target_ms / est_ms)))
    times = []
    for _ in range(n_meas):
        e0.record()
        for _ in range(inner):
            run()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1000.0 / inner)
    return statistics.median(times), method


# ----------------------------------------------------------------------------- floors


@triton.jit
def _read_kernel(x, out, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    base = pid.to(tl.int64) * BLOCK * ITERS
    for i in range(ITERS):
        idx = base + i * BLOCK + offs
        acc += tl.load(x + idx, mask=idx < n, other=0.0)
    tl.store(out + pid, tl.sum(acc, axis=0))


@triton.jit
def _copy_kernel(x, y, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    base = pid.to(tl.int64) * BLOCK * ITERS
    for i in range(ITERS):
        idx = base + i * BLOCK + offs
        tl.store(y + idx, tl.load(x + idx, mask=idx < n), mask=idx < n)


def floors(nbytes_state: int) -> dict:
    """Copy of the state pool's bytes three ways (the fastest is the read+write floor), and a read kernel."""
    n = nbytes_state // 4
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    t_graph, _ = time_us(lambda: dst.copy_(src))
    t_eager, _ = time_us(lambda: dst.copy_(src), graph=False)
    BLOCK, ITERS = 4096, 4
    grid = triton.cdiv(n, BLOCK * ITERS)
    t_tcopy, _ = time_us(lambda: _copy_kernel[(grid,)](src, dst, n, BLOCK=BLOCK, ITERS=ITERS, num_warps=8))
    grid_r = triton.cdiv(n, BLOCK * 8)
    partial = torch.empty(grid_r, device="cuda")
    t_read, _ = time_us(lambda: _read_kernel[(grid_r,)](src, partial, n, BLOCK=BLOCK, ITERS=8, num_warps=8))
    t_copy = min(t_graph, t_eager, t_tcopy)
    return {
        "state_bytes": nbytes_state,
        "copy_us": t_copy,
        "copy_graph_memcpy_us": t_graph,
        "copy_eager_memcpy_us": t_eager,
        "copy_triton_us": t_tcopy,
        "rw_floor_us": t_copy,
        "ro_floor_us": t_copy / 2,
        "read_kernel_us": t_read,
        "copy_TBps": 2 * nbytes_state / t_copy / 1e6,
        "read_TBps": nbytes_state / t_read / 1e6,
    }


# ----------------------------------------------------------------------------- problem


class Problem:
    """Pool of B+1 slots (slot 0 = SGLang's padding slot), rows use slots 1..B."""

    def __init__(self, model: str, B: int, seed: int = 0) -> None:
        p = MODELS[model]
        self.model, self.B = model, B
        H, HV, K, V = p["H"], p["HV"], p["K"], p["V"]
        self.H, self.HV, self.K, self.V, self.is_kda = H, HV, K, V, p["is_kda"]
        g = torch.Generator(device="cuda").manual_seed(seed)
        dev = "cuda"
        N = B + 1
        bf = torch.bfloat16
        self.qkv = torch.randn(B, 2 * H * K + HV * V, device=dev, generator=g).to(bf)
        self.a = torch.randn((B, HV, K) if self.is_kda else (B, HV), device=dev, generator=g).to(bf)
        self.b = torch.randn(B, HV, device=dev, generator=g).to(bf)
        self.A_log = torch.rand(HV, device=dev, generator=g) * 0.5 - 0.5
        self.dt_bias = torch.randn((HV, K) if self.is_kda else (HV,), device=dev, generator=g) * 0.3
        self.state = torch.randn(N, HV, V, K, device=dev, generator=g) * 0.01
        self.d = torch.randn(N, HV, L_RING, V, device=dev, generator=g) * 0.01
        self.k = torch.nn.functional.normalize(torch.randn(N, H, L_RING, K, device=dev, generator=g), dim=-1)
        gshape = (N, HV, L_RING, K) if self.is_kda else (N, HV, L_RING)
        self.g = -torch.rand(gshape, device=dev, generator=g) * 0.1
        self.slots = torch.arange(1, B + 1, dtype=torch.int32, device=dev)
        self.wps = [torch.full((B,), m, dtype=torch.int32, device=dev) for m in range(L_RING)]
        self.out = torch.empty(B, 1, HV, V, dtype=bf, device=dev)
        self.scale = K**-0.5

    def state_bytes(self) -> int:
        return self.B * self.HV * self.V * self.K * 4

    def ideal_window_bytes(self) -> float:
        """Bytes one averaged window step must move: S0 read, live records read, one record written,
        1/L of a state write (the flush)."""
        rec = (self.HV * self.V + self.H * self.K + (self.HV * self.K if self.is_kda else self.HV)) * 4 * self.B
        avg_live = (L_RING - 1) / 2
        return self.state_bytes() * (1 + 1 / L_RING) + rec * (avg_live + (L_RING - 1) / L_RING)

    def ring_step(self, fn: Callable, m: int, **kw: object) -> None:
        fn(
            self.qkv, self.a, self.b, self.A_log, self.dt_bias, self.scale, self.state, self.d, self.k, self.g,
            self.out, self.slots, self.wps[m], None, use_qk_l2norm_in_kernel=True, is_kda=self.is_kda, **kw,
        )  # fmt: skip

    def window(self, fn: Callable, **kw: object) -> Callable[[], None]:
        def run() -> None:
            for m in range(L_RING):
                self.ring_step(fn, m, **kw)

        return run


def _kernel_caches() -> list:
    kernels = (_ring_decode_kernel, ring_read_rows_kernel)
    return [c for k in kernels for c in k.device_caches.values()]


def regs_of_new_variants(before: set) -> list[dict]:
    """n_regs / n_spills of Triton variants compiled since ``before`` (best effort)."""
    res = []
    try:
        for cache in _kernel_caches():
            for key, ck in cache[0].items():
                if key not in before:
                    res.append({"n_regs": getattr(ck, "n_regs", None), "n_spills": getattr(ck, "n_spills", None)})
    except Exception:
        pass
    return res


def cache_keys() -> set:
    keys: set = set()
    try:
        for cache in _kernel_caches():
            keys |= set(cache[0].keys())
    except Exception:
        pass
    return keys


def sweep_configs(model: str, B: int, quick: bool, mode: str = "final") -> list[dict]:
    """Launch variants to time (v_split left to pick_config unless given).

    ``final``: the defaults' neighbourhood; ``explore``: register-cap / order / depth variants.
    """
    f = "fma"
    base = {"engine": "regs", "block_v": 8, "num_warps": 1, "flush_mode": f, "prefetch": 2, "split": B > 1}
    if mode == "explore":
        cfgs = [
            base,
            dict(base, prefetch=1),
            dict(base, row_major=True),
            dict(base, maxnreg=128),
            dict(base, maxnreg=96),
            dict(base, block_v=4),
            dict(base, block_v=4, maxnreg=96),
            dict(base, block_v=16, prefetch=1),
            dict(base, prefetch=1, maxnreg=96),
            dict(base, flush_mode="tf32x3"),
            dict(base, num_warps=2, prefetch=1, maxnreg=96),
            {"block_v": 16, "v_split": 1, "num_warps": 4, "flush_mode": f, "prefetch": 2, "split": True},
        ]
    else:
        cfgs = [
            dict(base, prefetch=1),
            base,
            dict(base, prefetch=1, flush_block_v=32, flush_num_warps=4),
            dict(base, prefetch=1, flush_block_v=16, flush_num_warps=2),
            dict(base, prefetch=1, row_major=True),
            {"engine": "regs", "block_v": 16, "num_warps": 1, "flush_mode": f, "prefetch": 1, "split": B > 1},
            {"engine": "regs", "block_v": 16, "v_split": 1, "num_warps": 4, "flush_mode": f, "prefetch": 2,
             "split": B > 1},
        ]
        if B > 1:
            cfgs += [c for c in slices_configs(B) if c["block_v"] == 8 and c["num_stages"] == 1]
        cfgs += cuda_configs(B)
        if B <= 1:
            cfgs += [
                {"engine": "regs", "block_v": 8, "v_split": 16, "num_warps": 1, "flush_mode": f, "prefetch": 1,
                 "split": False},
                {"engine": "regs", "block_v": 16, "num_warps": 4, "flush_mode": "ieee", "prefetch": 2, "split": False},
                {"engine": "regs", "block_v": 16, "num_warps": 4, "flush_mode": f, "prefetch": 1, "split": False},
            ]
    if mode == "slices":
        cfgs = [dict(base, prefetch=1, row_major=True)] + slices_configs(B)
    if mode == "cuda":
        cfgs = cuda_stage_configs()
    if quick:
        cfgs = cfgs[:3]
    return cfgs


def cuda_configs(B: int) -> list[dict]:
    """CUDA passes: the default build's neighbours (staging depth, persistent flush pass), and the
    CUDA read pass + Triton flush pass."""
    flush = {"block_v": 8, "num_warps": 1, "prefetch": 1, "flush_mode": "fma", "row_major": True}
    c = {"engine": "cuda", "cuda_warps": 2, "cuda_min_blocks": 4}
    both = [dict(c, cuda_stages=st, cuda_flush_stages=fst, cuda_flush_waves=fw)
            for st, fst, fw in ((2, 2, 1), (0, 0, 1), (0, 0, 0), (3, 3, 1))]  # fmt: skip
    return both + [dict(flush, engine="cuda", cuda_warps=1, cuda_min_blocks=4, cuda_flush=False)]


def cuda_stage_configs() -> list[dict]:
    """CUDA passes, overlapped, flush grid capped: checkpoint staging depth of each pass x how its
    rows are staged (cp.async per lane or one bulk copy) x the non-flush pass's halved tail
    (quarters of the resident warps) x the flush pass's register budget x warps per block. Each
    (flush_min_blocks, stages, flush_stages, bulk, flush_bulk) is one build."""
    c = {"engine": "cuda", "cuda_warps": 2, "cuda_min_blocks": 4, "cuda_flush_min_blocks": 1}
    return [
        dict(c, cuda_stages=st, cuda_flush_stages=fst, cuda_bulk=bk, cuda_flush_bulk=fbk, cuda_tail=tail,
             cuda_flush_min_blocks=fmb, cuda_warps=w, cuda_waves=0, cuda_flush_waves=1, cuda_overlap=True)
        for st, fst, bk, fbk, tail, fmb, w in [
            (3, 3, False, False, 4, 1, 2), (3, 3, False, False, 4, 1, 1), (3, 3, False, False, 4, 1, 4),
            (3, 3, False, False, 4, 3, 2), (4, 3, True, False, 4, 1, 1),
        ]
    ]  # fmt: skip


def slices_configs(B: int) -> list[dict]:
    """Row chunks held as column slices (chunk x slice width x warps x depth x tile order) + the
    row-chunk flush pass."""
    cfgs = []
    for ks, bv, nw, ns, qf, pm in [
        (16, 8, 1, 1, False, False), (16, 8, 1, 3, False, False), (32, 8, 1, 1, False, False),
        (16, 16, 2, 1, False, False), (16, 16, 2, 3, False, False), (16, 32, 4, 1, False, False),
        (16, 32, 4, 3, False, False), (32, 32, 4, 3, False, False), (16, 8, 1, 1, False, True),
        (16, 16, 2, 3, False, True), (16, 8, 1, 1, True, False), (32, 16, 2, 3, False, False),
    ]:  # fmt: skip
        cfgs.append({"engine": "slices", "slice_k": ks, "block_v": bv, "num_warps": nw, "num_stages": ns,
                     "slices_first": qf, "perm_rows": pm, "flush_block_v": 8, "flush_num_warps": 1,
                     "prefetch": 1, "flush_mode": "fma", "row_major": True})  # fmt: skip
    return cfgs


FAILED: set = set()  # (model, B, cfg) launch sets that failed in a precompile worker: not timed


def _job_key(model: str, B: int, cfg: dict) -> str:
    return json.dumps([model, B, cfg], sort_keys=True)


def precompile(jobs: list[tuple[str, int, dict]], workers: int) -> None:
    """Compile every (model, B, cfg) launch in ``workers`` processes so that the timing process
    finds them in Triton's on-disk cache (one process compiles one kernel at a time)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    t0 = time.time()
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as ex:
        errs = list(ex.map(_compile_one, jobs))
    bad = [e for e in errs if e]
    for job, e in zip(jobs, errs):
        if e:
            FAILED.add(_job_key(*job))
    log(f"precompiled {len(jobs)} launch sets in {time.time() - t0:.0f}s with {workers} workers; {len(bad)} failed")
    for e in bad[:5]:
        log("   ", e)


def _compile_one(job: tuple[str, int, dict]) -> str:
    model, B, cfg = job
    try:
        pb = Problem(model, B)
        for m in (0, L_RING - 1):
            pb.ring_step(ring_decode_triton, m, **cfg)
        torch.cuda.synchronize()
        return ""
    except Exception as e:
        return f"{model} B={B} {cfg}: {type(e).__name__}: {str(e)[:200]}"


def bench_model(model: str, B: int, sgl: object | None, quick: bool, mode: str = "final") -> dict:
    pb = Problem(model, B)
    row: dict = {"model": model, "B": B}
    row.update(floors(pb.state_bytes()))
    row["ideal_window_us"] = pb.ideal_window_bytes() / (row["copy_TBps"] * 1e6)
    row["ideal_window_at_read_bw_us"] = pb.ideal_window_bytes() / (row["read_TBps"] * 1e6)
    # ours: sweep
    sweep = []
    for cfg in sweep_configs(model, B, quick, mode):
        if _job_key(model, B, cfg) in FAILED:
            sweep.append({"cfg": cfg, "error": "failed in its precompile worker"})
            continue
        before = cache_keys()
        try:
            t, meth = time_us(pb.window(ring_decode_triton, **cfg))
            sweep.append({"cfg": cfg, "us_step": t / L_RING, "method": meth, "compiled": regs_of_new_variants(before)})
        except Exception as e:
            sweep.append({"cfg": cfg, "error": f"{type(e).__name__}: {str(e)[:300]}"})
    row["sweep"] = sweep
    ok = [s for s in sweep if "us_step" in s]
    best = min(ok, key=lambda s: s["us_step"]) if ok else None
    row["ours_best_us"] = best["us_step"] if best else math.nan
    row["ours_best_cfg"] = best["cfg"] if best else None
    from sglang_replayssm.kernels.ring_decode_cuda import available

    dflt = pick_config(B, pb.H, pb.HV, pb.K, pb.V, L_RING, is_kda=pb.is_kda, cuda=available())
    t, _ = time_us(pb.window(ring_decode_triton))
    row["ours_default_us"] = t / L_RING
    row["ours_default_cfg"] = dflt._asdict()
    if best:
        for rank, cand in enumerate(sorted(ok, key=lambda x: x["us_step"])[: len(ok) if mode == "cuda" else 3]):
            per_m = {}
            for m in (0, L_RING // 2, L_RING - 2, L_RING - 1):
                tm, _ = time_us(lambda m=m, cand=cand: pb.ring_step(ring_decode_triton, m, **cand["cfg"]))
                per_m[str(m)] = tm
            cand["per_cursor_us"] = per_m
            if rank == 0:
                row["ours_best_per_cursor_us"] = per_m
        if sgl is not None:
            per_m = {}
            for m in (0, L_RING - 2, L_RING - 1):
                tm, _ = time_us(lambda m=m: pb.ring_step(sgl.replayssm, m))
                per_m[str(m)] = tm
            row["sglang_replayssm_per_cursor_us"] = per_m
    # SGLang
    if sgl is not None:
        try:
            t, _ = time_us(pb.window(sgl.replayssm))
            row["sglang_replayssm_us"] = t / L_RING
        except Exception as e:
            row["sglang_replayssm_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        try:
            if model == "gdn":
                t, _ = time_us(
                    lambda: sgl.gdn_packed(
                        pb.qkv, pb.a, pb.b, pb.A_log, pb.dt_bias, pb.scale, pb.state, pb.out, pb.slots,
                        use_qk_l2norm_in_kernel=True,
                    )
                )  # fmt: skip
                row["sglang_packed_us"] = t
            else:
                a2 = pb.a.reshape(B, -1)
                dt2 = pb.dt_bias.reshape(-1)
                t, _ = time_us(
                    lambda: sgl.kda_packed_triton(
                        pb.qkv, a2, pb.b, pb.A_log, dt2, pb.scale, pb.state, pb.out, pb.slots,
                        use_qk_l2norm_in_kernel=True,
                    )
                )  # fmt: skip
                row["sglang_packed_us"] = t
                if sgl.kda_packed_cuda is not None:
                    t, meth = time_us(
                        lambda: sgl.kda_packed_cuda(
                            pb.qkv, a2, pb.b, pb.A_log, dt2, pb.scale, pb.state, pb.out, pb.slots, pb.H
                        )
                    )
                    row["sglang_packed_cuda_us"] = t
                    row["sglang_packed_cuda_method"] = meth
                else:
                    row["sglang_packed_cuda_error"] = sgl.cuda_error
        except Exception as e:
            row["sglang_packed_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return row


# ----------------------------------------------------------------------------- materialize


def bench_materialize(B: int, copy_TBps: dict) -> list[dict]:
    res = []
    try:
        import sglang_replayssm.kernels.materialize_triton as mt
    except Exception as e:
        return [{"error": f"materialize_triton not importable: {type(e).__name__}: {e}"}]
    fn = getattr(mt, "materialize_triton", None) or getattr(mt, "materialize", None)
    if fn is None:
        return [{"error": "no materialize function in kernels.materialize_triton"}]
    for model, p in MODELS.items():
        H, HV, K, V, is_kda = p["H"], p["HV"], p["K"], p["V"], p["is_kda"]
        N = 2 * B + 1
        try:
            temporal = torch.randn(1, N, HV, V, K, device="cuda") * 0.01
            d = torch.randn(1, N, HV, L_RING, V, device="cuda") * 0.01
            k = torch.nn.functional.normalize(torch.randn(1, N, H, L_RING, K, device="cuda"), dim=-1)
            g = -torch.rand((1, N, HV, L_RING, K) if is_kda else (1, N, HV, L_RING), device="cuda") * 0.1
            src = torch.arange(1, B + 1, dtype=torch.int64, device="cuda")
            dst = torch.arange(B + 1, 2 * B + 1, dtype=torch.int64, device="cuda")
            counts = torch.full((B,), L_RING - 1, dtype=torch.int32, device="cuda")
            args = (temporal, d, k, g, src, dst, counts)
            t, meth = time_us(lambda args=args, is_kda=is_kda: fn(*args, is_kda=is_kda, check_values=False))
            rec = (HV * V + H * K + (HV * K if is_kda else HV)) * 4
            nbytes = B * (2 * HV * V * K * 4 + (L_RING - 1) * rec)
            floor_us = nbytes / (copy_TBps[model] * 1e6)
            res.append({"model": model, "B": B, "us": t, "floor_us": floor_us, "x_floor": t / floor_us, "method": meth})
        except Exception as e:
            res.append({"model": model, "B": B, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        torch.cuda.empty_cache()
    return res


# ----------------------------------------------------------------------------- graph check


def graph_check(model: str = "gdn", B: int = 64, steps: int = 2 * L_RING + 8, **kw: object) -> dict:
    """Eager (sync-debug "error") vs CUDA-graph replay of cursor step + ring decode, bit for bit."""
    pb = Problem(model, B, seed=3)
    N = pb.state.shape[0]
    slots = pb.slots.clone()
    slots[::9] = -1  # padded rows
    interval = 7
    g = torch.Generator(device="cuda").manual_seed(9)
    inputs = [
        (
            torch.randn(pb.qkv.shape, device="cuda", generator=g).to(pb.qkv.dtype),
            torch.randn(pb.a.shape, device="cuda", generator=g).to(pb.a.dtype),
            torch.randn(pb.b.shape, device="cuda", generator=g).to(pb.b.dtype),
        )
        for _ in range(steps)
    ]
    seq0 = torch.randint(1, 200, (B,), device="cuda", generator=g)
    init = (pb.state.clone(), pb.d.clone(), pb.k.clone(), pb.g.clone())
    cursor0 = torch.randint(0, L_RING, (N,), dtype=torch.int32, device="cuda", generator=g)

    def reset() -> torch.Tensor:
        for t, s in zip((pb.state, pb.d, pb.k, pb.g), init):
            t.copy_(s)
        return cursor0.clone()

    st_qkv, st_a, st_b = torch.empty_like(pb.qkv), torch.empty_like(pb.a), torch.empty_like(pb.b)
    st_seq = torch.empty_like(seq0)
    wp_buf = torch.empty(B, dtype=torch.int32, device="cuda")
    ff_buf = torch.empty(B, dtype=torch.int32, device="cuda")
    out = torch.empty_like(pb.out)

    def step(cursor: torch.Tensor) -> None:
        wp, ff = cursor_step_triton(cursor, slots, L_RING, seq_lens=st_seq, track_interval=interval,
                                    wp_out=wp_buf, ff_out=ff_buf)  # fmt: skip
        ring_decode_triton(
            st_qkv, st_a, st_b, pb.A_log, pb.dt_bias, pb.scale, pb.state, pb.d, pb.k, pb.g, out, slots,
            wp, ff, use_qk_l2norm_in_kernel=True, is_kda=pb.is_kda, **kw,
        )  # fmt: skip

    def load(t: int) -> None:
        st_qkv.copy_(inputs[t][0])
        st_a.copy_(inputs[t][1])
        st_b.copy_(inputs[t][2])
        st_seq.copy_(seq0 + t)

    # eager, with host syncs turned into errors
    cursor = reset()
    load(0)
    step(cursor.clone())  # compile outside the sync check
    torch.cuda.synchronize()
    cursor = reset()
    eager_out = []
    torch.cuda.set_sync_debug_mode("error")
    sync_free = True
    try:
        for t in range(steps):
            load(t)
            step(cursor)
            eager_out.append(out.clone())
    except RuntimeError as e:
        sync_free = False
        log(f"    host sync detected in eager step: {e}")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    eager_final = (pb.state.clone(), pb.d.clone(), pb.k.clone(), pb.g.clone(), cursor.clone())
    # graph
    cursor = reset()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(cursor)  # capture only: nothing runs until replay
    cursor.copy_(cursor0)
    reset()
    equal_steps = 0
    for t in range(steps):
        load(t)
        graph.replay()
        if sync_free and torch.equal(out, eager_out[t]):
            equal_steps += 1
    final = (pb.state, pb.d, pb.k, pb.g, cursor)
    finals_equal = all(torch.equal(x, y) for x, y in zip(final, eager_final))
    return {
        "model": model,
        "B": B,
        "steps": steps,
        "padded_rows": int((slots < 0).sum()),
        "eager_sync_free": sync_free,
        "steps_bitwise_equal": equal_steps,
        "final_pool_ring_cursor_equal": finals_equal,
        "passed": sync_free and equal_steps == steps and finals_equal,
    }


# ----------------------------------------------------------------------------- report


def fmt(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1f}"


def table(rows: list[dict]) -> str:
    out = []
    for model in MODELS:
        mr = [r for r in rows if r["model"] == model]
        if not mr:
            continue
        if model == "gdn":
            out.append("\n### GDN, Qwen3-Next shape (H=16, HV=32, K=V=128), fp32 state, L=16\n")
            out.append(
                "| B | ours us/step | ours default | SGLang ReplaySSM | SGLang packed | rd-only floor | rd+wr floor "
                "| ours/rd-only | SGLang RS/rd-only | speedup vs packed | speedup vs SGLang RS |"
            )
            out.append("|---|---|---|---|---|---|---|---|---|---|---|")
            for r in mr:
                ours, rs, pk = r["ours_best_us"], r.get("sglang_replayssm_us"), r.get("sglang_packed_us")
                out.append(
                    f"| {r['B']} | {fmt(ours)} | {fmt(r['ours_default_us'])} | {fmt(rs)} | {fmt(pk)} "
                    f"| {fmt(r['ro_floor_us'])} | {fmt(r['rw_floor_us'])} | {ours / r['ro_floor_us']:.2f} "
                    f"| {(rs / r['ro_floor_us']) if rs else math.nan:.2f} | {(pk / ours) if pk else math.nan:.2f}x "
                    f"| {(rs / ours) if rs else math.nan:.2f}x |"
                )
        else:
            out.append("\n### KDA, Kimi-Linear shape (H=HV=32, K=V=128), fp32 state, L=16\n")
            out.append(
                "| B | ours us/step | ours default | SGLang ReplaySSM | SGLang packed Triton | SGLang packed CUDA "
                "| rd-only floor | rd+wr floor | ours/rd-only | speedup vs fastest packed | speedup vs SGLang RS |"
            )
            out.append("|---|---|---|---|---|---|---|---|---|---|---|")
            for r in mr:
                ours, rs = r["ours_best_us"], r.get("sglang_replayssm_us")
                pk_t, pk_c = r.get("sglang_packed_us"), r.get("sglang_packed_cuda_us")
                cands = [x for x in (pk_t, pk_c) if x]
                fastest = min(cands) if cands else None
                cuda_s = fmt(pk_c) if pk_c else ("not built" if r.get("sglang_packed_cuda_error") else "-")
                out.append(
                    f"| {r['B']} | {fmt(ours)} | {fmt(r['ours_default_us'])} | {fmt(rs)} | {fmt(pk_t)} | {cuda_s} "
                    f"| {fmt(r['ro_floor_us'])} | {fmt(r['rw_floor_us'])} | {ours / r['ro_floor_us']:.2f} "
                    f"| {(fastest / ours) if fastest else math.nan:.2f}x | {(rs / ours) if rs else math.nan:.2f}x |"
                )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sglang-root", type=Path, default=None, help="folder holding sglang/kernels/... files")
    ap.add_argument("--out", type=Path, default=Path("out"))
    ap.add_argument("--batches", type=str, default="1,64,256,512")
    ap.add_argument("--models", type=str, default="gdn,kda")
    ap.add_argument("--quick", action="store_true", help="3 sweep configs only")
    ap.add_argument("--sweep", choices=["final", "explore", "slices", "cuda"], default="final")
    ap.add_argument("--precompile-workers", type=int, default=0, help="compile the sweep in N processes first")
    ap.add_argument("--skip-materialize", action="store_true")
    ap.add_argument("--skip-graph-check", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        log("bench_kernels.py needs a CUDA GPU")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "device": torch.cuda.get_device_name(),
        "sms": torch.cuda.get_device_properties(0).multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": sys.version.split()[0],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "L": L_RING,
        "timing": "CUDA-graph replay, median of 9 measurements, per-step = window/L for ring kernels",
    }
    log(json.dumps(meta))
    sgl = None
    if args.sglang_root is not None:
        try:
            from sglang_replayssm.kernels.ring_decode_baselines import load_sglang_kernels

            t0 = time.time()
            sgl = load_sglang_kernels(args.sglang_root, Path("/tmp/kda_packed_build"))
            log(f"SGLang kernels loaded in {time.time() - t0:.1f}s; CUDA KDA packed: "
                f"{'ok' if sgl.kda_packed_cuda else sgl.cuda_error}")  # fmt: skip
        except Exception:
            log("SGLang kernels not loaded:\n" + traceback.format_exc())
    result: dict = {"meta": meta, "rows": [], "materialize": None, "graph_check": None}
    if args.precompile_workers > 0:
        jobs = [
            (model, B, cfg)
            for model in args.models.split(",")
            for B in [int(x) for x in args.batches.split(",")]
            for cfg in sweep_configs(model, B, args.quick, args.sweep)
        ]
        precompile(jobs, args.precompile_workers)
    json_path = args.out / "bench_kernels.json"
    for model in args.models.split(","):
        for B in [int(x) for x in args.batches.split(",")]:
            t0 = time.time()
            try:
                row = bench_model(model, B, sgl, args.quick, args.sweep)
            except Exception:
                log(traceback.format_exc())
                continue
            finally:
                torch.cuda.empty_cache()
            result["rows"].append(row)
            log(
                f"[{model} B={B}] ours {row['ours_best_us']:.1f} us ({row['ours_best_cfg']}) default "
                f"{row['ours_default_us']:.1f}; SGLang RS {row.get('sglang_replayssm_us', math.nan):.1f}; packed "
                f"{row.get('sglang_packed_us', math.nan):.1f}/{row.get('sglang_packed_cuda_us', math.nan):.1f}; "
                f"floors ro {row['ro_floor_us']:.1f} rw {row['rw_floor_us']:.1f} read-kernel "
                f"{row['read_kernel_us']:.1f} ideal {row['ideal_window_us']:.1f} ({time.time() - t0:.0f}s)"
            )
            json_path.write_text(json.dumps(result, indent=1))
    copy_bw = {r["model"]: r["copy_TBps"] for r in result["rows"] if r["B"] == 256}
    if copy_bw and not args.skip_materialize:
        result["materialize"] = bench_materialize(256, copy_bw)
        log("materialize:", json.dumps(result["materialize"]))
    if not args.skip_graph_check:
        checks = (("gdn", "graph_check", {}), ("kda", "graph_check_kda", {}),  # defaults (CUDA passes if built)
                  ("gdn", "graph_check_gdn_triton", {"engine": "regs"}),
                  ("kda", "graph_check_kda_triton", {"engine": "slices"}),
                  ("gdn", "graph_check_gdn_overlap", {"engine": "cuda", "cuda_overlap": True}),
                  ("kda", "graph_check_kda_overlap", {"engine": "cuda", "cuda_overlap": True}))  # fmt: skip
        for model, key, kw in checks:
            try:
                result[key] = graph_check(model, **kw)
            except Exception:
                result[key] = {"model": model, "passed": False, "error": traceback.format_exc()[-1500:]}
            log("graph check:", json.dumps(result[key]))
    json_path.write_text(json.dumps(result, indent=1))
    md = table(result["rows"])
    (args.out / "bench_kernels.md").write_text(md + "\n")
    log(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

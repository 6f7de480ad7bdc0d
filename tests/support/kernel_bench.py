"""Shared pieces of the kernel benchmark (``lab/scripts/bench_kernels.py``) and its profilers: the
model shapes, a CUDA-graph timer, memory-bandwidth floors, and :class:`Problem`, one layer's pool,
ring and decode inputs at a batch size.

Timing: each measured callable is captured in a CUDA graph (no Python launch overhead) and the
median over repeated replays is taken (falls back to eager launches if capture fails; callers
record which). Needs a CUDA GPU; nothing here runs at import.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from sglang_replayssm.kernels.ring_decode_slices import ring_read_rows_kernel
from sglang_replayssm.kernels.ring_decode_triton import ring_decode_kernel

__all__ = ["L_RING", "MODELS", "Problem", "cache_keys", "floors", "log", "regs_of_new_variants", "time_us"]

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
        self.H, self.HV, self.K, self.V, self.is_kda = H, HV, K, V, bool(p["is_kda"])
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
    kernels = (ring_decode_kernel, ring_read_rows_kernel)
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

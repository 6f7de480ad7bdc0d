"""The kernel benchmark's two checks beside the timings: the materialize kernel against its bytes
floor, and one decode step (device cursor step + ring decode) eager vs CUDA-graph replay."""

from __future__ import annotations

import functools

import torch

from lab.kernels.ring_decode_research import ring_decode_research
from sglang_replayssm.kernels.cursor import cursor_step_triton
from tests.support.kernel_bench import L_RING, MODELS, Problem, log, time_us

__all__ = ["bench_materialize", "graph_check"]


def bench_materialize(B: int, copy_TBps: dict) -> list[dict]:
    res = []
    try:
        from sglang_replayssm.kernels.materialize_ref import check_materialize_args
        from sglang_replayssm.kernels.materialize_triton import materialize_triton
    except Exception as e:
        return [{"error": f"materialize_triton not importable: {type(e).__name__}: {e}"}]
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
            call = check_materialize_args(temporal, d, k, g, src, dst, counts, is_kda=bool(is_kda), check_values=False)
            t, meth = time_us(functools.partial(materialize_triton, call))
            rec = (HV * V + H * K + (HV * K if is_kda else HV)) * 4
            nbytes = B * (2 * HV * V * K * 4 + (L_RING - 1) * rec)
            floor_us = nbytes / (copy_TBps[model] * 1e6)
            res.append({"model": model, "B": B, "us": t, "floor_us": floor_us, "x_floor": t / floor_us, "method": meth})
        except Exception as e:
            res.append({"model": model, "B": B, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        torch.cuda.empty_cache()
    return res


# ----------------------------------------------------------------------------- graph check


def graph_check(model: str = "gdn", B: int = 64, steps: int = 2 * L_RING + 8, tuning: dict | None = None) -> dict:
    """Eager (sync-debug "error") vs CUDA-graph replay of cursor step + ring decode (launched with
    ``tuning``, a sweep dict), bit for bit."""
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
        ring_decode_research(
            st_qkv, st_a, st_b, pb.A_log, pb.dt_bias, pb.scale, pb.state, pb.d, pb.k, pb.g, out, slots,
            wp, ff, use_qk_l2norm_in_kernel=True, is_kda=pb.is_kda, tuning=tuning,
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

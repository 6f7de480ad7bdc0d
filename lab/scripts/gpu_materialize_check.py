"""Materialize on a GPU: correctness vs the torch reference at the real shapes, CUDA-graph capture,
and time vs its bytes floor (checkpoint + records read, state written) for a few launch configs.

Run on the GPU box: `python3 lab/scripts/gpu_materialize_check.py` (prints a table, writes JSON to $OUT).
"""

from __future__ import annotations

import json
import os

import torch
import triton

from sglang_replayssm.kernels.materialize_ref import check_materialize_args, materialize_torch
from sglang_replayssm.kernels.materialize_triton import materialize_triton

SHAPES = {"gdn": dict(H=16, HV=32, K=128, V=128), "kda": dict(H=32, HV=32, K=128, V=128)}
B, L, COUNT = 256, 16, 15


def _pool(kind: str, gen: torch.Generator):
    s = SHAPES[kind]
    slots = 2 * B + 1
    dev = "cuda"
    temporal = torch.randn(1, slots, s["HV"], s["V"], s["K"], generator=gen, device=dev) * 0.1
    d = torch.randn(1, slots, s["HV"], L, s["V"], generator=gen, device=dev)
    k = torch.nn.functional.normalize(torch.randn(1, slots, s["H"], L, s["K"], generator=gen, device=dev), dim=-1)
    gshape = (1, slots, s["HV"], L, s["K"]) if kind == "kda" else (1, slots, s["HV"], L)
    g = -torch.rand(gshape, generator=gen, device=dev) * 0.3
    src = torch.arange(1, B + 1, device=dev, dtype=torch.int32)
    dst = src + B
    counts = torch.randint(0, L + 1, (B,), generator=gen, device=dev, dtype=torch.int32)
    counts[:8] = COUNT
    return temporal, d, k, g, src, dst, counts


def main() -> int:
    out_dir = os.environ.get("OUT", "out/gpu")
    os.makedirs(out_dir, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    # Copy bandwidth of this run: one big device copy (read + write).
    buf = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    copy_ms = triton.testing.do_bench(lambda: buf.clone(), warmup=50, rep=200, return_mode="median")
    bw = 2 * buf.numel() / (copy_ms * 1e-3)
    rows = []
    for kind in ("gdn", "kda"):
        temporal, d, k, g, src, dst, counts = _pool(kind, gen)
        ref = temporal.clone()
        is_kda = kind == "kda"
        materialize_torch(check_materialize_args(ref, d, k, g, src, dst, counts, is_kda=is_kda))
        # bytes: checkpoint read + state written + COUNT records (d, k, g) read per row, counts=COUNT
        s = SHAPES[kind]
        state_b = s["HV"] * s["V"] * s["K"] * 4
        rec_b = (s["HV"] * s["V"] + s["H"] * s["K"] + (s["HV"] * s["K"] if kind == "kda" else s["HV"])) * 4
        full = torch.full_like(counts, COUNT)
        floor_us = B * (2 * state_b + COUNT * rec_b) / bw * 1e6
        for block_v, warps in ((32, 4), (16, 2), (64, 4), (32, 2), (16, 1)):
            got = temporal.clone()
            materialize_triton(check_materialize_args(got, d, k, g, src, dst, counts, is_kda=is_kda),
                               block_v=block_v, num_warps=warps)
            torch.cuda.synchronize()
            rel = ((got - ref).norm() / ref[:, dst.long()].norm()).item()
            untouched = torch.equal(got[:, src.long()], temporal[:, src.long()])
            work = temporal.clone()
            g_graph = torch.cuda.CUDAGraph()
            call = check_materialize_args(work, d, k, g, src, dst, full, is_kda=is_kda, check_values=False)
            materialize_triton(call, block_v=block_v, num_warps=warps)
            torch.cuda.synchronize()
            with torch.cuda.graph(g_graph):
                materialize_triton(call, block_v=block_v, num_warps=warps)
            us = triton.testing.do_bench(g_graph.replay, warmup=20, rep=200, return_mode="median") * 1e3
            rows.append(dict(kind=kind, block_v=block_v, num_warps=warps, rel_err=rel, sources_untouched=untouched,
                             us=us, floor_us=floor_us, ratio=us / floor_us))
            print(f"{kind} BV={block_v:3d} warps={warps}: rel_err={rel:.2e} src_untouched={untouched} "
                  f"{us:8.1f} us  floor {floor_us:6.1f} us  x{us / floor_us:.2f}", flush=True)
    dev = torch.cuda.get_device_name()
    json.dump(dict(device=dev, copy_bw_tb_s=bw / 1e12, B=B, L=L, count=COUNT, rows=rows),
              open(os.path.join(out_dir, "materialize_gpu.json"), "w"), indent=1)
    print(f"device {dev}, copy bandwidth {bw / 1e12:.2f} TB/s (read+write)")
    ok = all(r["rel_err"] <= 1e-5 and r["sources_untouched"] for r in rows)
    print("CORRECT" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""GPU timing of the read-copy decode in the serving regime, beside SGLang's kernels and our fp32 ring.

Serving regime: row ``r`` at cursor ``(r + t) mod L`` in step ``t`` (every step has ``B/L`` flush
rows); each kernel's time is one window of ``L`` steps (CUDA-graph replay, median) divided by ``L``.
Arms, one table per model and batch size, all in one run:

* ``sglang_packed_fp32`` / ``_bf16``: SGLang's packed decode with an fp32 / bf16 state (GDN Triton;
  KDA Triton, plus its CUDA row-streaming kernel where it builds, fp32 state);
* ``sglang_rs_fp32`` / ``_bf16``: SGLang's ReplaySSM kernel, fp32 / bf16 checkpoint and (d, k) ring;
* ``ours_fp32``: the plugin's default ring decode (:func:`sglang_replayssm.kernels.ring_decode.ring_decode`);
* ``copy_bf16`` / ``copy_fp8``: :func:`sglang_replayssm.kernels.read_copy_cuda.read_copy_decode_cuda`, best of a
  small launch sweep (:data:`CUDA_SWEEP`; ring: ``d~`` bf16, ``k`` fp32, ``g`` fp32, ``v`` bf16,
  ``beta`` fp32), with its per-cursor times and a check against the torch reference;
* ``copy_triton_bf16`` / ``_fp8`` (``--triton``): the first Triton kernel
  (:func:`lab.kernels.read_copy_triton.read_copy_decode_triton`), best of :data:`SWEEP`.

Each arm has its bytes floor (:func:`window_bytes` over the measured copy bandwidth). Needs CUDA.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lab.kernels.read_copy_triton import read_copy_decode_triton
from sglang_replayssm.kernels.read_copy_format import quantize
from sglang_replayssm.kernels.read_copy_ref import read_copy_decode_torch
from tests.support.kernel_bench import L_RING, MODELS, Problem, floors, log, time_us

__all__ = ["ARMS", "SWEEPS", "main", "pass_split", "sweep_config", "window_bytes"]

ARMS = ("sglang_packed_fp32", "sglang_packed_bf16", "sglang_rs_fp32", "sglang_rs_bf16", "ours_fp32",
        "copy_bf16", "copy_fp8", "copy_triton_bf16", "copy_triton_fp8")  # fmt: skip
SWEEP = ((16, 2), (16, 4), (32, 4), (32, 8), (64, 4), (64, 8), (128, 8))
#: (depth, min_blocks, flush_parts, mode[, tc[, prefetch[, recip[, stages[, d_tile[, rows]]]]]]) of
#: :class:`sglang_replayssm.kernels.read_copy_cuda.ReadCopyCudaConfig`; flush_parts 0: :func:`default_config`'s; mode 0:
#: side stream, 1: high-priority side stream, 2: one stream, flush pass first; tc 1: GDN's flush on
#: tensor cores (``tc_flush``; not swept for KDA, whose flush it leaves sequential); prefetch 1: the
#: flush pass loads the next block's state rows during the current one (``flush_prefetch``); recip 1:
#: the fp8 copy written with a reciprocal per row (``fp8_recip``); stages: the non-flush pass's chunks
#: staged in shared memory (``stages``; 0: in registers); d_tile 1: the register path's ``d~`` records
#: in shared memory (``d_tile``); rows N: the flush pass in the row layout at N blocks per SM
#: (``flush_rows``), -1: pipelined (``flush_pipe``) (flush_parts then unused); fmin N: the warp-layout
#: flush pass capped for N resident warps per SM (``flush_min_blocks``); rw: warps per non-flush block
#: (``read_warps``); pair 1: two flush blocks replayed together (``flush_pair``); per_sm N: the flush
#: grid as N warps per SM (``flush_per_sm``). The warp-layout sweeps of 2026-12-02 are in
#: notes/read-copy-h200-2026-12-02-{sweep,staged}.json; this sweep is the row layout beside the
#: product's launch (the arm's ``default`` entry).
CUDA_SWEEP = ((2, 4, 0, 1, 0, 1, 1, 4, 0, 2), (2, 4, 0, 1, 0, 1, 1, 4, 0, -1), (2, 4, 0, 0, 0, 1, 1, 4, 0, -1),
              (2, 4, 0, 2, 0, 1, 1, 4, 0, -1), (2, 4, 0, 1, 0, 1, 1, 0, 0, -1), (2, 5, 0, 1, 0, 1, 1, 4, 0, -1),
              (2, 3, 0, 1, 0, 1, 1, 4, 0, -1), (2, 4, 0, 1, 0, 1, 1, 0, 1, -1))  # fmt: skip
#: ``--sweep warp``: the warp-layout flush pass's launch knobs around :func:`default_config`'s staged
#: launch (flush parts, non-flush register budget, side-stream priority, stages, prefetch)
CUDA_SWEEP_WARP = ((2, 4, 0, 1, 0, 1, 1, 4), (2, 4, 2, 1, 0, 1, 1, 4), (2, 5, 0, 1, 0, 1, 1, 4), (2, 3, 0, 1, 0, 1, 1, 4),
                   (2, 4, 0, 0, 0, 1, 1, 4), (2, 4, 0, 1, 0, 1, 1, 3), (2, 4, 0, 1, 0, 1, 1, 6),
                   (2, 4, 0, 1, 0, 0, 1, 4))  # fmt: skip
#: ``--sweep share``: how the two passes share an SM while both run (the flush pass's register cap, the
#: non-flush pass's block size) around the staged launch
CUDA_SWEEP_SHARE = ((2, 4, 0, 1, 0, 1, 1, 4, 0, 0, 0, 4), (2, 4, 0, 1, 0, 1, 1, 4, 0, 0, 9, 4),
                    (2, 4, 0, 1, 0, 1, 1, 4, 0, 0, 12, 4), (2, 4, 0, 1, 0, 0, 1, 4, 0, 0, 16, 4),
                    (2, 4, 0, 1, 0, 1, 1, 4, 0, 0, 0, 1), (2, 4, 0, 1, 0, 1, 1, 4, 0, 0, 12, 1),
                    (2, 4, 0, 1, 0, 1, 1, 4, 0, 0, 0, 2), (2, 5, 0, 1, 0, 1, 1, 4, 0, 0, 0, 1))  # fmt: skip
#: ``--sweep pair``: the paired flush replay (``flush_pair``) against the staged launch, by flush parts
#: and non-flush block size
CUDA_SWEEP_PAIR = ((2, 4, 0, 1, 0, 1, 1, 4, 0, 0, 0, 1), (2, 4, 0, 1, 0, 0, 1, 4, 0, 0, 0, 4, 1),
                   (2, 4, 0, 1, 0, 0, 1, 4, 0, 0, 0, 1, 1), (2, 4, 1, 1, 0, 0, 1, 4, 0, 0, 0, 1, 1),
                   (2, 4, 2, 1, 0, 0, 1, 4, 0, 0, 0, 1, 1), (2, 4, 4, 1, 0, 0, 1, 4, 0, 0, 0, 1, 1),
                   (2, 5, 0, 1, 0, 0, 1, 4, 0, 0, 0, 1, 1), (2, 4, 0, 1, 0, 0, 1, 0, 0, 0, 0, 1, 1),
                   (2, 4, 1, 1, 0, 0, 1, 4, 0, 0, 0, 1, 1, 4), (2, 4, 1, 1, 0, 0, 1, 4, 0, 0, 0, 1, 1, 3),
                   (2, 4, 1, 1, 0, 0, 1, 4, 0, 0, 0, 1, 1, 2), (2, 4, 0, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 4),
                   (2, 4, 2, 1, 0, 0, 1, 4, 0, 0, 0, 1, 1, 4))  # fmt: skip
#: ``--sweep grid``: the flush grid in warps per SM (``flush_per_sm``) by flush parts, paired replay or
#: prefetch, and non-flush block size
CUDA_SWEEP_GRID = ((2, 4, 0, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 4), (2, 4, 0, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 5),
                   (2, 4, 0, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 6), (2, 4, 1, 1, 0, 0, 1, 4, 0, 0, 0, 1, 1, 5),
                   (2, 4, 1, 1, 0, 0, 1, 4, 0, 0, 0, 1, 1, 6), (2, 4, 1, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 4),
                   (2, 4, 1, 1, 0, 0, 1, 4, 0, 0, 0, 4, 1, 4), (2, 5, 1, 1, 0, 0, 1, 4, 0, 0, 0, 1, 1, 4),
                   (2, 4, 2, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 6), (2, 4, 0, 1, 0, 1, 1, 4, 0, 0, 0, 4, 0, 4),
                   (2, 4, 1, 1, 0, 0, 1, 4, 0, 0, 0, 1, 1, 4), (2, 5, 0, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 4))  # fmt: skip
#: ``--sweep table`` (the docs' table): beside the default, the staged launch on the resident flush grid
#: (the earlier default; KDA with 2 flush parts as it had up to 512 pairs), the default written out (a
#: repeat), the paired replay, and GDN fp8's non-flush budget for both
CUDA_SWEEP_TABLE = ((2, 4, 0, 1, 0, 1, 1, 4), (2, 4, 2, 1, 0, 1, 1, 4), (2, 4, 1, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 4),
                    (2, 4, 1, 1, 0, 0, 1, 4, 0, 0, 0, 1, 1, 4), (2, 5, 1, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 4))  # fmt: skip
#: ``--sweep tcread``: the staged non-flush pass's row sums on tensor cores (``tc_read``, field 14)
#: beside the default launch written out (a repeat): same launch, non-flush budget 5 (GDN fp8's
#: default), 6 stages, 5 flush warps per SM
CUDA_SWEEP_TCREAD = ((2, 4, 1, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 4, 0), (2, 4, 1, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 4, 1),
                     (2, 5, 1, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 4, 1), (2, 4, 1, 1, 0, 1, 1, 6, 0, 0, 0, 1, 0, 4, 1),
                     (2, 4, 1, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 5, 1), (2, 5, 1, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 4, 0))  # fmt: skip
#: ``--sweep tile``: the flush pass in the tile layout (``flush_tile``, field 15: lanes own 4 rows x 16
#: columns, key tables per item; 2: two blocks replayed together, no prefetch) with the non-flush pass
#: in eight lanes per copy row (``read_rows``, field 16), beside the default launch written out (a
#: repeat): non-flush budget 4 / 5, 3 / 5 flush warps per SM, the paired tile replay
CUDA_SWEEP_TILE = ((2, 4, 1, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 4, 0, 0, 0), (2, 4, 1, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 4, 0, 1, 1),
                   (2, 5, 1, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 4, 0, 1, 1), (2, 4, 1, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 5, 0, 1, 1),
                   (2, 4, 1, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 3, 0, 1, 1), (2, 5, 1, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 5, 0, 1, 1),
                   (2, 5, 1, 1, 0, 0, 1, 4, 0, 0, 0, 1, 0, 4, 0, 2, 1))  # fmt: skip
#: ``--sweep default``: the default above 256 flush pairs written out (a repeat), beside it at 16
#: non-flush warps per SM, and the default before ``flush_tile`` / ``read_rows``
CUDA_SWEEP_DEFAULT = ((2, 5, 1, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 4, 0, 1, 1), (2, 4, 1, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 4, 0, 1, 1),
                      (2, 4, 1, 1, 0, 1, 1, 4, 0, 0, 0, 1, 0, 4, 0, 0, 0))  # fmt: skip
SWEEPS = {"rows": CUDA_SWEEP, "warp": CUDA_SWEEP_WARP, "share": CUDA_SWEEP_SHARE, "pair": CUDA_SWEEP_PAIR, "grid": CUDA_SWEEP_GRID, "table": CUDA_SWEEP_TABLE,
          "tcread": CUDA_SWEEP_TCREAD, "tile": CUDA_SWEEP_TILE,
          "default": CUDA_SWEEP_DEFAULT}


def window_bytes(arm: str, H: int, HV: int, K: int, V: int, L: int, is_kda: bool) -> float:
    """HBM bytes one (row, value head) moves per step, averaged over a staggered window.

    Ring arms: non-flush steps (cursor ``m = 0..L-2``) read the state (or copy) and ``m`` records and
    write one; the flush step reads the fp32 checkpoint and ``L-1`` records and writes the checkpoint
    (and the copy). Key records are shared by the ``HV/H`` value heads of a key head (counted once)."""
    E, G = V * K, HV // H
    g_b = 4 * (K if is_kda else 1)
    if arm.startswith("sglang_packed"):
        return 2 * E * (4 if arm.endswith("fp32") else 2)
    nf_steps = L - 1
    avg_live = (L - 2) / 2  # mean cursor of the non-flush steps
    if arm in ("sglang_rs_fp32", "sglang_rs_bf16", "ours_fp32"):
        sb = 2 if arm == "sglang_rs_bf16" else 4
        rec = V * sb + K * sb / G + g_b
        nf = E * sb + avg_live * rec + rec
        fl = 2 * E * sb + (L - 1) * rec
        return (nf_steps * nf + fl) / L
    cb = 2 if arm.endswith("bf16") else 1
    sc = 0 if arm.endswith("bf16") else 4 * V
    db = 2  # d~ record in bf16
    rec_fold = V * db + K * 4 / G + g_b  # d~, k fp32, g
    rec_raw = K * 4 / G + g_b + V * 2 + 4  # k, g, v bf16, beta
    rec_write = V * db + K * 4 / G + g_b + V * 2 + 4
    nf = E * cb + sc + avg_live * rec_fold + rec_write
    fl = 4 * E + (L - 1) * rec_raw + 4 * E + E * cb + sc
    return (nf_steps * nf + fl) / L


class StaggeredProblem(Problem):
    """:class:`Problem` plus staggered cursors, bf16 copies of pool and ring, and the read-copy buffers."""

    def __init__(self, model: str, B: int) -> None:
        super().__init__(model, B)
        dev = self.state.device
        self.stag = [torch.tensor([(r + t) % L_RING for r in range(B)], dtype=torch.int32, device=dev)
                     for t in range(L_RING)]  # fmt: skip
        self.state_bf = self.state.to(torch.bfloat16)
        self.d_bf, self.k_bf = self.d.to(torch.bfloat16), self.k.to(torch.bfloat16)
        N = B + 1
        self.v_ring = torch.randn(N, self.HV, L_RING, self.V, device=dev).to(torch.bfloat16)
        self.beta_ring = torch.rand(N, self.HV, L_RING, device=dev)
        self.copies = {fmt: quantize(self.state, fmt, self.is_kda) for fmt in ("bf16", "fp8")}

    def stag_window(self, step: Callable[..., object]) -> Callable[[], None]:
        def run() -> None:
            for t in range(L_RING):
                step(self.stag[t])

        return run

    def copy_step(self, fn: Callable, fmt: str, wp: torch.Tensor, slots: torch.Tensor | None = None,
                  **kw: object) -> object:
        copy, scales = self.copies[fmt]
        return fn(
            self.qkv, self.a, self.b, self.A_log, self.dt_bias, self.scale, self.state, copy, scales,
            self.d_bf, self.k, self.g, self.v_ring, self.beta_ring, self.out,
            self.slots if slots is None else slots, wp, None,
            use_qk_l2norm_in_kernel=True, is_kda=self.is_kda, **kw,
        )  # fmt: skip


def _copy_launch(pb: StaggeredProblem, fmt: str, bv: int, nw: int, wp: torch.Tensor) -> object:
    return pb.copy_step(read_copy_decode_triton, fmt, wp, block_v=bv, num_warps=nw)


def _cuda_launch(pb: StaggeredProblem, fmt: str, cfg: tuple[int, ...], wp: torch.Tensor,
                 slots: torch.Tensor | None = None) -> object:
    from sglang_replayssm.kernels.read_copy_cuda import default_config, read_copy_decode_cuda

    if not cfg:  # the product's launch (read_copy_cuda.default_config)
        return pb.copy_step(read_copy_decode_cuda, fmt, wp, slots)

    rows = cfg[9] if len(cfg) > 9 else 0
    c = sweep_config(cfg, None if rows else cfg[2] or default_config(pb.B, pb.HV, L_RING, pb.is_kda, fmt).flush_parts)
    return pb.copy_step(read_copy_decode_cuda, fmt, wp, slots, config=c)


def sweep_config(cfg: tuple[int, ...], parts: int | None) -> Any:
    """A sweep tuple (:data:`CUDA_SWEEP`'s fields) as a :class:`lab.kernels.read_copy_lab.LabReadCopyConfig` (the
    research options need the lab source) with ``parts`` flush parts (the tuple's own, when not 0, are resolved by
    the caller)."""
    from lab.kernels.read_copy_lab import LabReadCopyConfig as ReadCopyCudaConfig

    rows = cfg[9] if len(cfg) > 9 else 0
    return ReadCopyCudaConfig(depth=cfg[0], min_blocks=cfg[1], flush_parts=None if rows else parts,
                              overlap=cfg[3] != 2, high_priority=cfg[3] == 1, tc_flush=len(cfg) > 4 and cfg[4] == 1,
                              flush_prefetch=len(cfg) > 5 and cfg[5] == 1, fp8_recip=len(cfg) > 6 and cfg[6] == 1,
                              stages=cfg[7] if len(cfg) > 7 else 0, d_tile=len(cfg) > 8 and cfg[8] == 1,
                              flush_rows=max(rows, 0), flush_pipe=rows < 0,
                              flush_min_blocks=cfg[10] if len(cfg) > 10 else 0,
                              read_warps=cfg[11] if len(cfg) > 11 else 4, flush_pair=len(cfg) > 12 and cfg[12] == 1,
                              flush_per_sm=cfg[13] if len(cfg) > 13 else 0,
                              tc_read=len(cfg) > 14 and cfg[14] == 1,
                              flush_tile=cfg[15] if len(cfg) > 15 else 0,
                              read_rows=len(cfg) > 16 and cfg[16] == 1)  # fmt: skip


def pass_split(pb: StaggeredProblem, fmt: str, cfg: tuple[int, ...] = ()) -> dict[str, float]:
    """One launch's staggered step (us) with both passes, with only the flush rows (the other rows'
    slots set to padding, so the non-flush pass only zeroes their outputs), with only the non-flush
    rows, and with the two passes on one stream (``cfg``'s mode 2): whether and how far they overlap."""
    B, dev = pb.B, pb.state.device
    flushing = [(torch.arange(B, device=dev) + t) % L_RING == L_RING - 1 for t in range(L_RING)]
    pad = torch.full_like(pb.slots, -1)
    only = {"flush_only": [torch.where(f, pb.slots, pad) for f in flushing],
            "read_only": [torch.where(f, pad, pb.slots) for f in flushing]}  # fmt: skip
    base = cfg or _staged_default(pb, fmt)
    serial = base[:3] + (2,) + base[4:]
    res: dict[str, float] = {}

    def window(c: tuple[int, ...], slots: list[torch.Tensor] | None) -> Callable[[], None]:
        def run() -> None:
            for t in range(L_RING):
                _cuda_launch(pb, fmt, c, pb.stag[t], None if slots is None else slots[t])

        return run

    res["both"] = time_us(window(cfg, None))[0] / L_RING
    for key, sl in only.items():
        res[key] = time_us(window(cfg, sl))[0] / L_RING
    res["serial"] = time_us(window(serial, None))[0] / L_RING
    return res


def _staged_default(pb: StaggeredProblem, fmt: str) -> tuple[int, ...]:
    """:func:`default_config`'s launch as a sweep tuple (for its one-stream twin)."""
    from lab.kernels.read_copy_lab import as_lab
    from sglang_replayssm.kernels.read_copy_cuda import default_config

    c = as_lab(default_config(pb.B, pb.HV, L_RING, pb.is_kda, fmt))
    return (c.depth, c.min_blocks, c.flush_parts or 0, 1 if c.high_priority else 0, int(c.tc_flush),
            int(c.flush_prefetch), int(c.fp8_recip), c.stages, int(c.d_tile), c.flush_rows or -int(c.flush_pipe),
            c.flush_min_blocks, c.read_warps, int(c.flush_pair), c.flush_per_sm, int(c.tc_read),
            c.flush_tile, int(c.read_rows))  # fmt: skip


def _check(pb: StaggeredProblem, fmt: str, cuda: bool, cfg: tuple[int, ...] = CUDA_SWEEP[0]) -> dict:
    """One staggered window (+2 steps) of the kernel against the torch reference from identical buffers."""
    import copy as copymod

    ref, tri = copymod.deepcopy(pb), copymod.deepcopy(pb)
    worst_out = 0.0
    for t in range(L_RING + 2):
        wp = pb.stag[t % L_RING]
        ref.copy_step(read_copy_decode_torch, fmt, wp)
        if cuda:
            _cuda_launch(tri, fmt, cfg, wp)
        else:
            tri.copy_step(read_copy_decode_triton, fmt, wp)
        worst_out = max(worst_out, float((tri.out.float() - ref.out.float()).norm() / ref.out.float().norm()))
    res = {"out_rel_max": worst_out, "state_rel": float((tri.state - ref.state).norm() / ref.state.norm())}
    c1, c2 = tri.copies[fmt][0].float(), ref.copies[fmt][0].float()
    res["copy_rel"] = float((c1 - c2).norm() / c2.norm())
    return res


def bench(model: str, B: int, sgl: Any, triton_arms: bool = False, sweep_name: str = "rows") -> dict:
    from sglang_replayssm.kernels.ring_decode import ring_decode

    pb = StaggeredProblem(model, B)
    p = MODELS[model]
    row: dict = {"model": model, "B": B}
    fl = floors(pb.state_bytes())
    row["copy_TBps"] = fl["copy_TBps"]
    # the read bandwidth a torch reduction reaches over the bf16 copies (the non-flush pass's stream)
    cp = pb.copies["bf16"][0]
    row["sum_read_TBps"] = cp.numel() * cp.element_size() / (time_us(lambda: torch.sum(cp, dtype=torch.float32))[0] * 1e6)
    times: dict[str, float] = {}

    def put(arm: str, fn: Callable[..., object], per: int = L_RING) -> None:
        try:
            t, meth = time_us(fn)
            times[arm] = t / per
            row[f"{arm}_method"] = meth
        except Exception as e:
            row[f"{arm}_error"] = f"{type(e).__name__}: {str(e)[:300]}"

    ring_kw: dict = {"use_qk_l2norm_in_kernel": True, "is_kda": pb.is_kda}
    if sgl is not None:
        a2 = pb.a.reshape(B, -1)
        dt2 = pb.dt_bias.reshape(-1)
        for dt, st in (("fp32", pb.state), ("bf16", pb.state_bf)):
            if model == "gdn":
                put(f"sglang_packed_{dt}", lambda st=st: sgl.gdn_packed(
                    pb.qkv, pb.a, pb.b, pb.A_log, pb.dt_bias, pb.scale, st, pb.out, pb.slots,
                    use_qk_l2norm_in_kernel=True), per=1)  # fmt: skip
            else:
                put(f"sglang_packed_{dt}", lambda st=st: sgl.kda_packed_triton(
                    pb.qkv, a2, pb.b, pb.A_log, dt2, pb.scale, st, pb.out, pb.slots,
                    use_qk_l2norm_in_kernel=True), per=1)  # fmt: skip
                if getattr(sgl, "kda_packed_cuda", None) is not None:
                    put(f"sglang_packed_cuda_{dt}", lambda st=st: sgl.kda_packed_cuda(
                        pb.qkv, a2, pb.b, pb.A_log, dt2, pb.scale, st, pb.out, pb.slots, pb.H), per=1)  # fmt: skip
        for dt, st, d, k in (("fp32", pb.state, pb.d, pb.k), ("bf16", pb.state_bf, pb.d_bf, pb.k_bf)):
            put(f"sglang_rs_{dt}", pb.stag_window(lambda wp, st=st, d=d, k=k: sgl.replayssm(
                pb.qkv, pb.a, pb.b, pb.A_log, pb.dt_bias, pb.scale, st, d, k, pb.g, pb.out, pb.slots, wp, None,
                **ring_kw)))  # fmt: skip
    put("ours_fp32", pb.stag_window(lambda wp: ring_decode(
        pb.qkv, pb.a, pb.b, pb.A_log, pb.dt_bias, pb.scale, pb.state, pb.d, pb.k, pb.g, pb.out, pb.slots, wp, None,
        **ring_kw)))  # fmt: skip
    for fmt in ("bf16", "fp8"):
        arms: tuple[tuple[str, Callable[..., object], tuple[tuple[int, ...], ...]], ...] = (
            (f"copy_{fmt}", _cuda_launch, ((),) + SWEEPS[sweep_name]),
            (f"copy_triton_{fmt}", _copy_launch, SWEEP if triton_arms else ()),
        )
        for arm, launch, configs in arms:
            if not configs:
                continue
            sweep: dict[str, float | str] = {}
            if pb.is_kda:
                configs = tuple(c for c in configs if len(c) <= 4 or c[4] == 0)
            for cfg in configs:
                name = "_".join(map(str, cfg)) or "default"
                try:
                    t, _ = time_us(pb.stag_window(functools.partial(launch, pb, fmt, *_args(cfg))))
                    sweep[name] = t / L_RING
                except Exception as e:
                    sweep[name] = f"{type(e).__name__}: {str(e)[:200]}"
            row[f"{arm}_sweep"] = sweep
            ok = {k: v for k, v in sweep.items() if isinstance(v, float)}
            if ok:
                best = min(ok, key=ok.__getitem__)
                # the product's launch is the arm's time where it ran; the sweep's best beside it
                times[arm] = ok.get("default", ok[best])
                row[f"{arm}_cfg"] = "default" if "default" in ok else best
                row[f"{arm}_best_sweep"] = [best, ok[best]]
                picked = () if "default" in ok else tuple(int(x) for x in best.split("_"))
                # where the time goes: every row at one cursor (0 and 7: non-flush; L-1: all rows flush)
                best_cfg = () if best == "default" else tuple(int(x) for x in best.split("_"))
                for key, cfg in (("uniform_cursor_us", picked), ("best_uniform_cursor_us", best_cfg)):
                    if key.startswith("best") and cfg == picked:
                        continue
                    per_m = {}
                    for m in (0, 7, L_RING - 1):
                        wp = torch.full((B,), m, dtype=torch.int32, device=pb.state.device)
                        per_m[str(m)] = time_us(functools.partial(launch, pb, fmt, *_args(cfg), wp))[0]
                    row[f"{arm}_{key}"] = per_m
                if launch is _cuda_launch:  # whether the passes overlap (default launch, and the best)
                    row[f"{arm}_split"] = {"default": pass_split(pb, fmt)}
                    if best != "default":
                        row[f"{arm}_split"][best] = pass_split(pb, fmt, best_cfg)
            try:
                small = StaggeredProblem(model, min(B, 64))
                if launch is _cuda_launch and ok:
                    row[f"{arm}_check"] = _check(small, fmt, True, picked)
                else:
                    row[f"{arm}_check"] = _check(small, fmt, launch is _cuda_launch)
            except Exception as e:
                row[f"{arm}_check"] = f"{type(e).__name__}: {str(e)[:300]}"
    row["us"] = times
    row["floor_us"] = {}
    for arm in times:
        base = arm.replace("sglang_packed_cuda", "sglang_packed")
        if base in ARMS:
            nb = window_bytes(base, p["H"], p["HV"], p["K"], p["V"], L_RING, bool(p["is_kda"])) * B * p["HV"]
            row["floor_us"][arm] = nb / (fl["copy_TBps"] * 1e6)
    fast_lp = [times[a] for a in times if a.endswith("bf16") and a.startswith("sglang")]
    packed32 = [times[a] for a in times if a.startswith("sglang_packed") and a.endswith("fp32")]
    packed = [times[a] for a in times if a.startswith("sglang_packed")]
    for fmt in ("bf16", "fp8"):
        if f"copy_{fmt}" not in times:
            continue
        t = times[f"copy_{fmt}"]
        if fast_lp:
            row[f"copy_{fmt}_vs_fastest_sglang_bf16"] = t / min(fast_lp)
        if packed32:
            row[f"copy_{fmt}_speedup_vs_fastest_packed_fp32"] = min(packed32) / t
        if packed:
            row[f"copy_{fmt}_speedup_vs_fastest_packed"] = min(packed) / t
        if f"copy_{fmt}" in row["floor_us"]:
            row[f"copy_{fmt}_x_floor"] = t / row["floor_us"][f"copy_{fmt}"]
    log(json.dumps({k: v for k, v in row.items() if not k.endswith("_sweep")}, default=str))
    return row


def _args(cfg: tuple[int, ...]) -> tuple:
    """A sweep entry as the launch helpers take it: Triton ``(bv, nw)`` spread, CUDA one tuple."""
    return cfg if len(cfg) == 2 else (cfg,)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sglang-root", type=Path, default=None, help="folder holding SGLang's kernel files")
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256, 512])
    ap.add_argument("--models", nargs="+", default=["gdn", "kda"])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--triton", action="store_true", help="also time the first Triton kernel (slow)")
    ap.add_argument("--sweep", choices=sorted(SWEEPS), default="rows", help="the CUDA launches timed beside the default")
    args = ap.parse_args(argv)
    sgl = None
    if args.sglang_root is not None:
        from tests.support.ring_decode_baselines import load_sglang_kernels

        sgl = load_sglang_kernels(args.sglang_root, args.sglang_root / "kda_build")
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "L": L_RING, "rows": []}
    for model in args.models:
        for B in args.batches:
            res["rows"].append(bench(model, B, sgl, args.triton, args.sweep))
            if args.json is not None:
                args.json.write_text(json.dumps(res, indent=1, default=str))

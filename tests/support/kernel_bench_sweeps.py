"""The kernel benchmark's launch sweeps (flat dicts of :class:`~sglang_replayssm.kernels.
ring_decode_config.RingDecodeConfig` fields and :class:`~lab.kernels.
ring_decode_research.ResearchKnobs`, as :func:`~lab.kernels.
ring_decode_research.ring_decode_research` takes them) and their precompilation in worker
processes."""

from __future__ import annotations

import json
import time

import torch

from lab.kernels.ring_decode_research import ring_decode_research
from tests.support.kernel_bench import L_RING, Problem, log

__all__ = ["FAILED", "cuda_configs", "cuda_stage_configs", "job_key", "precompile", "slices_configs", "sweep_configs"]


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


def job_key(model: str, B: int, cfg: dict) -> str:
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
            FAILED.add(job_key(*job))
    log(f"precompiled {len(jobs)} launch sets in {time.time() - t0:.0f}s with {workers} workers; {len(bad)} failed")
    for e in bad[:5]:
        log("   ", e)


def _compile_one(job: tuple[str, int, dict]) -> str:
    model, B, cfg = job
    try:
        pb = Problem(model, B)
        for m in (0, L_RING - 1):
            pb.ring_step(ring_decode_research, m, tuning=cfg)
        torch.cuda.synchronize()
        return ""
    except Exception as e:
        return f"{model} B={B} {cfg}: {type(e).__name__}: {str(e)[:200]}"

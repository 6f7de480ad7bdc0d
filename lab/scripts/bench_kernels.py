#!/usr/bin/env python3
"""Decode-kernel benchmark on one GPU: our ring decode vs SGLang 0.5.23's kernels vs memory floors.

One run prints (markdown) and writes as JSON, for GDN (Qwen3-Next: H=16, HV=32, K=V=128) and KDA
(Kimi-Linear: H=HV=32, K=V=128), fp32 state, bf16 inputs/outputs, L=16, B in {1, 64, 256, 512}:

* ours: best launch of a small sweep (``ring_decode_research`` with each sweep dict), and the
  product's default (``ring_decode`` with ``pick_config``'s choice); per-step time averaged over
  one full ring window (15 non-flush steps + 1 flush, every row at the same cursor, the way
  SGLang's kernel was measured for docs/BENCHMARKS.md);
* SGLang's ReplaySSM kernel (same window), SGLang's packed decode (GDN Triton; KDA Triton and the
  CUDA row-streaming kernel built from SGLang's header with nvcc + tvm_ffi);
* floors from the same run: a device-to-device copy of the state pool (read+write floor), half of
  it (read-only floor), and a Triton read-only kernel (achievable read bandwidth);
* materialize (``kernels.materialize_triton``) at B=256 vs its bytes floor;
* a CUDA-graph check: one decode step (device cursor step + our kernel) captured, replayed for
  2L+8 steps, compared bit for bit with eager; eager steps run under
  ``torch.cuda.set_sync_debug_mode("error")`` (any host sync raises).

Timing: :func:`tests.support.kernel_bench.time_us` (CUDA-graph replays, median).
Performance is reported, never asserted. Imports the installed package (or the one on
``PYTHONPATH``, as lab/scripts/gpu_check.sh sets it).

Usage: ``python lab/scripts/bench_kernels.py --sglang-root DIR [--out DIR] [--quick] [--sweep NAME]``
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the product, tests.support, lab
from lab.kernels.ring_decode_research import ring_decode_research  # noqa: E402
from sglang_replayssm.kernels.ring_decode import pick_config, ring_decode  # noqa: E402
from sglang_replayssm.kernels.ring_decode_cuda import available  # noqa: E402
from tests.support.kernel_bench import (  # noqa: E402
    L_RING,
    MODELS,
    Problem,
    cache_keys,
    floors,
    log,
    regs_of_new_variants,
    time_us,
)
from tests.support.kernel_bench_checks import bench_materialize, graph_check  # noqa: E402
from tests.support.kernel_bench_sweeps import FAILED, job_key, precompile, sweep_configs  # noqa: E402


def bench_model(model: str, B: int, sgl: Any, quick: bool, mode: str = "final") -> dict:
    pb = Problem(model, B)
    row: dict = {"model": model, "B": B}
    row.update(floors(pb.state_bytes()))
    row["ideal_window_us"] = pb.ideal_window_bytes() / (row["copy_TBps"] * 1e6)
    row["ideal_window_at_read_bw_us"] = pb.ideal_window_bytes() / (row["read_TBps"] * 1e6)
    # ours: sweep
    sweep = []
    for cfg in sweep_configs(model, B, quick, mode):
        if job_key(model, B, cfg) in FAILED:
            sweep.append({"cfg": cfg, "error": "failed in its precompile worker"})
            continue
        before = cache_keys()
        try:
            t, meth = time_us(pb.window(ring_decode_research, tuning=cfg))
            sweep.append({"cfg": cfg, "us_step": t / L_RING, "method": meth, "compiled": regs_of_new_variants(before)})
        except Exception as e:
            sweep.append({"cfg": cfg, "error": f"{type(e).__name__}: {str(e)[:300]}"})
    row["sweep"] = sweep
    ok = [s for s in sweep if "us_step" in s]
    best = min(ok, key=lambda s: s["us_step"]) if ok else None
    row["ours_best_us"] = best["us_step"] if best else math.nan
    row["ours_best_cfg"] = best["cfg"] if best else None
    dflt = pick_config(B, pb.H, pb.HV, pb.K, pb.V, L_RING, is_kda=pb.is_kda, cuda=available())
    t, _ = time_us(pb.window(ring_decode))
    row["ours_default_us"] = t / L_RING
    row["ours_default_cfg"] = dataclasses.asdict(dflt)
    if best:
        for rank, cand in enumerate(sorted(ok, key=lambda x: x["us_step"])[: len(ok) if mode == "cuda" else 3]):
            per_m = {}
            for m in (0, L_RING // 2, L_RING - 2, L_RING - 1):
                tm, _ = time_us(lambda m=m, cand=cand: pb.ring_step(ring_decode_research, m, tuning=cand["cfg"]))
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
            from tests.support.ring_decode_baselines import load_sglang_kernels

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
                result[key] = graph_check(model, tuning=kw)
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

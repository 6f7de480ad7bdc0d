"""Decode kernels under the serving protocol (:mod:`tests.support.serving_protocol`), ours beside SGLang's and
vLLM's, on one CUDA GPU, within a time budget.

For each batch size and model (GDN: H=16, HV=32; KDA: H=HV=32; K=V=128; ring L=16), every arm: ``layers``
layers interleaved in one captured CUDA graph of a 16-step window with staggered cursors, distinct pools per
layer, every launch the product's decode step makes (cursor step, stale refresh, flush and non-flush passes);
``samples`` back-to-back replays, each a batch; per layer-step: median, p90, p90/median; the bytes floor
(:func:`tests.support.read_copy_bench.window_bytes` at the measured copy bandwidth) and the ratio to it; the
old single-layer number (:func:`tests.support.kernel_bench.time_us` over one layer's window: the best of
batches of replays, L2 warm) in a second, labelled column.

Arms (:data:`tests.support.serving_protocol.ARMS`): ``ours_fp32`` (the fp32 ring, the product default: the CUDA
passes), ``ours_fp32_fused`` / ``ours_fp32_fused3`` (the same, its two passes in one launch, register budget 4 / 3 blocks per SM), ``copy_bf16`` / ``copy_fp8`` (the read copy), SGLang's packed decode with an fp32 / bf16 state (GDN
Triton; KDA Triton and its CUDA kernel), SGLang's ReplaySSM kernel (fp32 / bf16 checkpoint and ring), vLLM's
packed GDN decode (fp32 / bf16 state; carry of ``lab/scripts/vllm_carry.sh``). An arm that fails records its
error and the run goes on; an arm that would start past the budget is recorded as skipped. The JSON is
rewritten after every arm, so a run killed at its time limit keeps what it measured.

    python lab/scripts/bench_serving_protocol.py --sglang-root /tmp/site --out out/serving_protocol --budget-s 200
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the product, tests.support

import torch  # noqa: E402

from tests.support.kernel_bench import MODELS  # noqa: E402
from tests.support.serving_protocol import (  # noqa: E402
    ARMS,
    FUSED_MIN_BLOCKS,
    Shape,
    Stack,
    arm_step,
    replay_times,
    ring_decode_fused,
    stats,
    window,
)

T0 = time.monotonic()
PROTOCOL = ("per arm: `layers` layers with distinct pools and inputs, one CUDA graph of a 16-step window, row r at cursor "
            "(r + t) mod 16 (the device cursor step once per step, shared by the layers, in the graph; ring arms only), "
            "every launch the product's decode makes per layer (fp32 ring: ring_decode's CUDA passes; read copy: stale "
            "refresh + flush and non-flush passes via radix/read_copy/store.decode_step); a batch = one replay, "
            "us per layer-step = replay / (16 * layers); median and p90 over the batches (back-to-back replays)")
DEVICE = "cuda"  # the CPU smoke of main() sets "cpu"


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def _err(e: BaseException) -> str:
    tail = traceback.format_exc().strip().splitlines()[-3:]
    return f"{type(e).__name__}: {str(e)[:300]} | {' / '.join(x.strip() for x in tail)[:400]}"


def load_kernels(args: argparse.Namespace, res: dict) -> tuple[dict[str, Callable[..., Any]], threading.Thread | None, dict]:
    """Our kernels, SGLang's (Triton at once; the KDA CUDA kernel built on a thread while the GDN arms run) and
    vLLM's, each failure recorded in ``res["load"]``; returns the kernels, the build thread and its result box."""
    from sglang_replayssm.kernels.read_copy_cuda import read_copy_decode_cuda
    from sglang_replayssm.kernels.ring_decode import ring_decode

    kernels: dict[str, Callable[..., Any]] = {"ring_decode": ring_decode, "read_copy_decode": read_copy_decode_cuda,
                                              **{k: ring_decode_fused(n) for k, n in FUSED_MIN_BLOCKS.items()}}
    load: dict[str, str] = res.setdefault("load", {})
    box: dict[str, Any] = {}
    thread = None
    if args.sglang_root is not None:
        try:
            from tests.support.ring_decode_baselines import build_kda_packed_cuda, load_sglang_kernels

            sgl = load_sglang_kernels(args.sglang_root, build_cuda=False)
            kernels["sglang_rs"] = sgl.replayssm
            kernels["sglang_packed_gdn"] = sgl.gdn_packed
            kernels["sglang_packed_kda"] = sgl.kda_packed_triton
            load["sglang"] = "ok"
            if "kda" in args.models and not args.no_kda_cuda:
                build_dir = args.kda_build_dir or args.sglang_root / "kda_build"

                def build() -> None:
                    t = time.monotonic()
                    try:
                        box["fn"] = build_kda_packed_cuda(args.sglang_root, build_dir)
                    except BaseException as e:  # recorded, the arm reports it
                        box["error"] = f"{type(e).__name__}: {str(getattr(e, 'stderr', '') or e)[-400:]}"
                    box["seconds"] = time.monotonic() - t

                thread = threading.Thread(target=build, daemon=True)
                thread.start()
        except Exception as e:
            load["sglang"] = _err(e)
    else:
        load["sglang"] = "no --sglang-root"
    try:
        from tests.support.vllm_fla import load_vllm_packed_decode

        kernels["vllm_packed"] = load_vllm_packed_decode(args.vllm_carry)
        load["vllm"] = "ok: " + (args.vllm_carry / "SOURCE").read_text().splitlines()[0]
    except Exception as e:
        load["vllm"] = _err(e)
    return kernels, thread, box


def kernels_for(model: str, kernels: dict[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """``kernels`` with ``sglang_packed`` set to the model's SGLang packed decode."""
    out = dict(kernels)
    if f"sglang_packed_{model}" in kernels:
        out["sglang_packed"] = kernels[f"sglang_packed_{model}"]
    return out


def run_arm(shape: Shape, arm: str, kernels: dict[str, Callable[..., Any]], args: argparse.Namespace) -> dict:
    """One arm at one shape: the protocol's batches, the single-layer column, sanity flags."""
    spec = ARMS[arm]
    ours = spec.kernel.startswith("ours")
    need = "ring_decode" + spec.kernel[4:] if ours else {"copy": "read_copy_decode"}.get(spec.kernel, spec.kernel)
    if need not in kernels:
        return {"error": f"kernel {need} not loaded"}
    entry: dict[str, Any] = {}
    stack = Stack(shape, spec, DEVICE, seed=args.seed)
    start_wp = stack.write_pos.clone()
    step = arm_step(stack, kernels)
    if ours:
        from sglang_replayssm.kernels.ring_decode import checked_step, default_config

        stack.cursor()
        stack.write_pos.copy_(start_wp)
        st = checked_step(stack.qkv[0], stack.a[0], stack.b[0], stack.A_log[0], stack.dt_bias[0], stack.scale,
                          stack.state[0], stack.d[0], stack.k[0], stack.g[0], stack.out[0], stack.slots, stack.wp,
                          stack.ff, True, shape.is_kda)  # fmt: skip
        entry["engine"] = default_config(st).engine + (f" fused{FUSED_MIN_BLOCKS[need]}" if need != "ring_decode" else "")
    elif spec.kernel == "copy":
        from sglang_replayssm.kernels.read_copy_cuda import default_config as copy_config

        entry["config"] = str(copy_config(shape.B, shape.HV, shape.L, shape.is_kda, spec.copy or "bf16"))
    t = time.monotonic()
    us, method = replay_times(window(stack, step), args.samples)
    per = shape.L * shape.layers
    entry.update(stats(us, per))
    entry.update(method=method, seconds=round(time.monotonic() - t, 2), samples_us=[round(x / per, 2) for x in us])
    entry["cursors_cyclic"] = bool(torch.equal(stack.write_pos, start_wp))
    entry["out_finite"] = bool(torch.isfinite(stack.out.float()).all())
    if args.single:
        from tests.support.kernel_bench import time_us

        entry["single_layer_us"] = time_us(window(stack, step, [0]))[0] / shape.L
    del stack, step
    return entry


def ratios(row: dict, copy_tbps: float | None) -> None:
    """Bytes floors per arm and the issue's comparisons, in place (missing arms leave their ratio out)."""
    from tests.support.read_copy_bench import window_bytes

    p, arms = MODELS[row["model"]], row["arms"]
    med = {a: e["median"] for a, e in arms.items() if isinstance(e.get("median"), float)}
    for a, e in arms.items():
        if copy_tbps and a in med:
            nb = window_bytes(ARMS[a].floor, p["H"], p["HV"], p["K"], p["V"], row["L"], bool(p["is_kda"]))
            e["floor_us"] = nb * row["B"] * p["HV"] / (copy_tbps * 1e6)
            e["x_floor"] = med[a] / e["floor_us"]
    r: dict[str, float] = {}
    sgl32 = [med[a] for a in ("sglang_packed_fp32", "sglang_packed_cuda_fp32") if a in med]
    sgl_bf = [med[a] for a in med if a.startswith("sglang") and a.endswith("bf16")]
    for a in ("ours_fp32", "ours_fp32_fused", "ours_fp32_fused3"):
        if sgl32 and a in med:
            r[f"{a}_speedup_vs_sglang_packed_fp32"] = min(sgl32) / med[a]
    if sgl_bf and "copy_bf16" in med:
        r["copy_bf16_over_fastest_sglang_bf16"] = med["copy_bf16"] / min(sgl_bf)
    for fmt in ("bf16", "fp8"):
        if sgl32 and f"copy_{fmt}" in med:
            r[f"copy_{fmt}_speedup_vs_sglang_packed_fp32"] = min(sgl32) / med[f"copy_{fmt}"]
    for a in ("ours_fp32", "copy_bf16", "copy_fp8"):
        if "vllm_packed_fp32" in med and a in med:
            r[f"{a}_speedup_vs_vllm_packed_fp32"] = med["vllm_packed_fp32"] / med[a]
    if sgl32 and "vllm_packed_fp32" in med:
        r["vllm_packed_fp32_speedup_vs_sglang_packed_fp32"] = min(sgl32) / med["vllm_packed_fp32"]
    row["ratios"] = r


def markdown(res: dict) -> str:
    """Per model: one line per (B, arm): median, p90, p90/median, floor ratio, single-layer column; then the
    comparisons."""
    lines = [f"# Serving protocol ({res.get('device')}, {res['layers']} layers interleaved, L={res['L']}, "
             f"{res['samples']} batches per arm; us per layer-step)", "",
             f"Copy bandwidth {res.get('copy_TBps') or float('nan'):.2f} TB/s (the bytes floors' bandwidth). "
             "single-layer: the old protocol (one layer's window with the same launches, best of batches, L2 warm).", ""]  # fmt: skip
    for model in res["models"]:
        lines += [f"## {model.upper()}", "", "| B | arm | median | p90 | p90/med | floor | x floor | single-layer |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for row in (r for r in res["rows"] if r["model"] == model):
            for a, e in row["arms"].items():
                if "median" not in e:
                    why = str(e.get("error") or e.get("skipped", "")).replace("\n", " ").replace("|", "/")[:100]
                    lines.append(f"| {row['B']} | {a} | {why} ||||||")
                    continue
                f = lambda k, e=e: f"{e[k]:.1f}" if isinstance(e.get(k), float) else ""  # noqa: E731
                lines.append(f"| {row['B']} | {a} | {e['median']:.1f} | {e['p90']:.1f} | {e['p90_over_median']:.3f} | "
                             f"{f('floor_us')} | {e.get('x_floor', float('nan')):.2f} | {f('single_layer_us')} |")
        lines += [""]
        for row in (r for r in res["rows"] if r["model"] == model):
            if row.get("ratios"):
                lines.append(f"- B={row['B']}: " + ", ".join(f"{k} {v:.3f}" for k, v in row["ratios"].items()))
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sglang-root", type=Path, default=None, help="folder holding sglang/kernels/... (SGLang's files)")
    ap.add_argument("--vllm-carry", type=Path, default=Path(".gpucarry/vllm_fla"), help="lab/scripts/vllm_carry.sh's folder")
    ap.add_argument("--kda-build-dir", type=Path, default=None, help="where SGLang's KDA CUDA kernel is built (default <sglang-root>/kda_build)")
    ap.add_argument("--no-kda-cuda", action="store_true", help="skip SGLang's KDA CUDA kernel (its nvcc build)")
    ap.add_argument("--models", nargs="+", default=["gdn", "kda"], choices=sorted(MODELS))
    ap.add_argument("--batches", type=int, nargs="+", default=[256, 64, 512], help="in this order")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), help="in this order")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--samples", type=int, default=20, help="batches (window replays) per arm, >= 10")
    ap.add_argument("--no-single", dest="single", action="store_false", help="leave out the single-layer column")
    ap.add_argument("--quick", action="store_true", help="B=256 only, 10 batches, no single-layer column")
    ap.add_argument("--budget-s", type=float, default=200.0, help="no arm starts after this many seconds of the run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("out/serving_protocol"), help="writes OUT.json and OUT.md")
    args = ap.parse_args(argv)
    if args.quick:
        args.batches, args.samples, args.single = [256], 10, False
    args.samples = max(10, args.samples)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU (the CPU tests drive tests.support.serving_protocol)", file=sys.stderr)
        return 2
    import triton

    res: dict[str, Any] = {"protocol": PROTOCOL, "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                           "python": sys.version.split()[0], "L": 16, "layers": args.layers, "samples": args.samples,
                           "models": args.models, "batches": args.batches, "budget_s": args.budget_s,
                           "cuda_cache": os.environ.get("SGLANG_REPLAYSSM_CUDA_CACHE"), "rows": []}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        res["elapsed_s"] = round(time.monotonic() - T0, 1)
        args.out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
        args.out.with_suffix(".md").write_text(markdown(res))

    log(f"{res['device']} torch {res['torch']} triton {res['triton']}; budget {args.budget_s:.0f}s")
    kernels, thread, box = load_kernels(args, res)
    log(f"kernels loaded: {res['load']}")
    try:
        from tests.support.kernel_bench import floors

        res["copy_TBps"] = floors(1 << 30)["copy_TBps"]
        log(f"copy bandwidth {res['copy_TBps']:.2f} TB/s")
    except Exception as e:
        res["copy_TBps"], res["copy_TBps_error"] = None, _err(e)
    save()
    last = 5.0
    for B in args.batches:
        for model in args.models:
            p = MODELS[model]
            shape = Shape(p["H"], p["HV"], p["K"], p["V"], bool(p["is_kda"]), B, 16, args.layers)
            row: dict[str, Any] = {"model": model, "B": B, "L": 16, "layers": args.layers, "arms": {}}
            res["rows"].append(row)
            ks = kernels_for(model, kernels)
            for arm in args.arms:
                if model not in ARMS[arm].models:
                    continue
                left = args.budget_s - (time.monotonic() - T0)
                if left < max(3.0, 1.5 * last):
                    row["arms"][arm] = {"skipped": f"budget ({left:.0f}s left)"}
                    log(f"{model} B={B} {arm}: skipped (budget, {left:.0f}s left)")
                    continue
                if ARMS[arm].kernel == "sglang_packed_cuda" and "sglang_packed_cuda" not in ks and thread is not None:
                    thread.join(timeout=max(0.0, min(45.0, left - 10)))  # not built yet: tried again at the next B
                    if "fn" in box:
                        kernels["sglang_packed_cuda"] = ks["sglang_packed_cuda"] = box["fn"]
                    res["load"]["sglang_kda_cuda"] = box.get("error", f"built in {box.get('seconds', 0):.0f}s"
                                                              if "fn" in box else "build still running")
                t = time.monotonic()
                try:
                    row["arms"][arm] = got = run_arm(shape, arm, ks, args)
                except Exception as ex:
                    row["arms"][arm] = got = {"error": _err(ex)}
                finally:
                    gc.collect()
                    torch.cuda.empty_cache()
                last = time.monotonic() - t
                msg = got.get("error") or (f"median {got['median']:.1f} p90 {got['p90']:.1f} us/layer-step "
                                         f"(p90/med {got['p90_over_median']:.3f}, {got['method']}, single "
                                         f"{got.get('single_layer_us', float('nan')):.1f})")  # fmt: skip
                log(f"{model} B={B} {arm}: {msg} [{last:.1f}s]")
                ratios(row, res.get("copy_TBps"))
                save()
            log(f"{model} B={B} ratios: " + json.dumps({k: round(v, 3) for k, v in row.get("ratios", {}).items()}))
    save()
    log(f"done: {args.out.with_suffix('.json')} and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Read-copy measurements (issue 15).

``drift`` (CPU): a long synthetic recurrence (:mod:`tests.support.read_copy_bench_drift`)
through the read-copy decode (bf16 / fp8) and a shared bf16 / fp8 state, against the fp64 oracle;
writes ``<out>.json`` (binned output errors, worst flushed-checkpoint error vs fp32 decode and vs
fp64) and ``<out>.png``. Opt-in and slow: ~15 ms per step for all variants at the default shape.

``gpu`` (CUDA): the serving-regime timing table, :func:`tests.support.read_copy_bench.main`.

    python lab/scripts/bench_read_copy.py drift --steps 131072 --out notes/read-copy-drift
    python lab/scripts/bench_read_copy.py gpu --sglang-root .devcarry --json notes/read-copy-h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the product, tests.support, lab
from tests.support.read_copy_bench_drift import make_inputs, rel, run_copy, run_oracle, run_shared  # noqa: E402


def _binned(err: torch.Tensor, bins: int) -> list[float]:
    T = err.shape[0]
    w = max(1, T // bins)
    return [float(err[i : i + w].mean()) for i in range(0, T - w + 1, w)]


def drift(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    res: dict = {"steps": args.steps, "L": args.L, "K": args.K, "b_mean": args.b_mean, "models": {}}
    for model in args.models:
        kda = model == "kda"
        t0 = time.time()
        inp = make_inputs(args.steps, args.B, 1, 1, args.K, args.K, kda, seed=args.seed, b_mean=args.b_mean)
        runs = {fmt: run_copy(inp, fmt, args.L) for fmt in ("bf16", "fp8")}
        steps = {t for r in runs.values() for t, _, _ in r.flushed}
        ref, st64 = run_oracle(inp, states_at=steps)
        _, st32 = run_oracle(inp, torch.float32, states_at=steps)
        entry: dict = {}
        for fmt, run in runs.items():
            entry[f"copy-{fmt}"] = _binned(rel(run.out, ref, (1, 2, 3)), args.bins)
            entry[f"shared-{fmt}"] = _binned(rel(run_shared(inp, fmt), ref, (1, 2, 3)), args.bins)
            entry[f"ckpt-{fmt}-vs-fp32-max"] = max(float(rel(c, st32[t][r])) for t, r, c in run.flushed)
            entry[f"ckpt-{fmt}-vs-fp64-max"] = max(float(rel(c, st64[t][r])) for t, r, c in run.flushed)
        entry["fp32-decode-vs-fp64-max"] = max(float(rel(st32[t][r], st64[t][r])) for t in steps for r in range(args.B))
        entry["seconds"] = time.time() - t0
        res["models"][model] = entry
        print(model, {k: v for k, v in entry.items() if not isinstance(v, list)}, flush=True)
    with open(f"{args.out}.json", "w") as f:
        json.dump(res, f, indent=1)
    _plot(res, f"{args.out}.png")


def _plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(res["models"])
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        entry = res["models"][model]
        for key, style in (("copy-bf16", "b-"), ("shared-bf16", "b--"), ("copy-fp8", "r-"), ("shared-fp8", "r--")):
            ys = entry[key]
            xs = [(i + 0.5) * res["steps"] / len(ys) for i in range(len(ys))]
            ax.plot(xs, ys, style, label=key)
        ax.set_yscale("log")
        ax.set_xlabel("decode step")
        ax.set_ylabel("output rel. error vs fp64 (binned mean)")
        ax.set_title(f"{model.upper()}: read copy (fp32 recurrence) vs shared low-precision state")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    if sys.argv[1:2] == ["gpu"]:  # its own options: tests.support.read_copy_bench.main
        from tests.support.read_copy_bench import main as gpu_main

        gpu_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("drift")
    d.add_argument("--steps", type=int, default=131072)
    d.add_argument("--L", type=int, default=16)
    d.add_argument("--K", type=int, default=32)
    d.add_argument("--B", type=int, default=2)
    d.add_argument("--b-mean", type=float, default=-4.0)
    d.add_argument("--seed", type=int, default=2)
    d.add_argument("--bins", type=int, default=128)
    d.add_argument("--models", nargs="+", default=["gdn", "kda"])
    d.add_argument("--out", default="notes/read-copy-drift")
    sub.add_parser("gpu", help="see tests.support.read_copy_bench (--help after gpu)")
    drift(ap.parse_args())


if __name__ == "__main__":
    main()

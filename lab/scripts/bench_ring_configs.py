"""The fp32 ring's CUDA launch choices side by side under the serving protocol (:mod:`tests.support.serving_protocol`),
beside SGLang's packed fp32 decode, rotated over rounds so drift hits every arm alike.

A config is ``NAME=key:value,...`` over :class:`~sglang_replayssm.kernels.ring_decode_config.RingDecodeConfig`'s
``cuda_*`` fields (without the prefix: ``warps``, ``stages``, ``flush_stages``, ``fused``, ``tail``, ...) and
:func:`~sglang_replayssm.kernels.ring_decode_cuda.run_passes`' research keywords (``bulk``, ``flush_bulk``,
``waves``, ``vsplit``), applied on top of the product default (:func:`~sglang_replayssm.kernels.ring_decode.
default_config`); ``default`` (no overrides) is always measured. Per (model, B, arm): the median over rounds of each
round's median per layer-step (``samples`` replays of a window of ``layers`` interleaved layers), the spread of the
round medians, and the packed fp32 decode's time over the arm's. Outputs of every config are checked bit for bit
against the default's after one window from the same start (the launches serve the same rows; a difference is a bug).

    python lab/scripts/bench_ring_configs.py --sglang-root /tmp/site --batches 64 256 \\
        --config w1=warps:1 --config bulk43w1=warps:1,stages:4,bulk:1 --out out/ring_configs
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the product, tests.support

import torch  # noqa: E402

from tests.support.kernel_bench import MODELS  # noqa: E402
from tests.support.serving_protocol import ARMS, ArmSpec, Shape, Stack, arm_step, replay_times, stats, window  # noqa: E402

RUN_KEYS = ("bulk", "flush_bulk", "waves", "vsplit")  # run_passes' research keywords; the rest are cuda_* fields


def parse_config(text: str, copy: bool = False) -> tuple[str, dict[str, Any]]:
    """``NAME=key:value,...`` -> (name, overrides); ``ValueError`` on a malformed item or an unknown key. Ring
    configs: ``cuda_*`` fields without the prefix and :data:`RUN_KEYS`; read-copy configs (``copy``):
    :class:`~sglang_replayssm.kernels.read_copy_cuda.ReadCopyCudaConfig`'s fields and ``fmt`` (bf16 or fp8)."""
    name, _, body = text.partition("=")
    if not name or not body:
        raise ValueError(f"config {text!r}: expected NAME=key:value,...")
    from sglang_replayssm.kernels.read_copy_cuda import ReadCopyCudaConfig
    from sglang_replayssm.kernels.ring_decode_config import RingDecodeConfig

    cls = ReadCopyCudaConfig if copy else RingDecodeConfig
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    out: dict[str, Any] = {}
    for item in body.split(","):
        key, _, value = item.partition(":")
        field = key if copy else f"cuda_{key}"
        if copy and key == "fmt":
            if value not in ("bf16", "fp8"):
                raise ValueError(f"config {name}: fmt is bf16 or fp8 (got {value!r})")
            out[key] = value
        elif field in defaults:
            out[key] = bool(int(value)) if isinstance(defaults[field], bool) else int(value)
        elif not copy and key in RUN_KEYS:
            out[key] = int(value)
        else:
            raise ValueError(f"config {name}: unknown key {key!r}")
    return name, out


def ring_with(overrides: dict[str, int]) -> Callable[..., None]:
    """``ring_decode``'s positional arguments -> the default CUDA config with ``overrides`` applied."""
    from sglang_replayssm.kernels.ring_decode import checked_step, default_config
    from sglang_replayssm.kernels.ring_decode_cuda import run_passes

    fields = {f"cuda_{k}": v for k, v in overrides.items() if k not in RUN_KEYS}
    run_kw = {k: bool(v) if "bulk" in k else v for k, v in overrides.items() if k in RUN_KEYS}

    def fn(*args: Any, use_qk_l2norm_in_kernel: bool, is_kda: bool) -> None:
        step = checked_step(*args, use_qk_l2norm_in_kernel, is_kda)  # type: ignore[call-arg]
        cfg = default_config(step)
        if cfg.engine != "cuda":
            raise RuntimeError(f"the default engine here is {cfg.engine}, not the CUDA passes")
        run_passes(step, dataclasses.replace(cfg, **fields), **run_kw)

    return fn


def copy_with(overrides: dict[str, Any], shape: Shape) -> tuple[str, Callable[..., Any]]:
    """(fmt, the read copy's CUDA decode with the default config of ``shape`` and ``overrides`` applied)."""
    from sglang_replayssm.kernels.read_copy_cuda import default_config, read_copy_decode_cuda

    fields = {k: v for k, v in overrides.items() if k != "fmt"}
    fmt = overrides.get("fmt", "bf16")
    cfg = dataclasses.replace(default_config(shape.B, shape.HV, shape.L, shape.is_kda, fmt), **fields)
    return fmt, functools.partial(read_copy_decode_cuda, config=cfg)


def build_arm(shape: Shape, arm: str, ctx: dict[str, Any]) -> tuple[Stack, Callable[[int], None]]:
    """``arm``'s stack and per-layer step: ``ours_NAME`` (a ring config), ``copy_NAME`` (a read-copy config),
    or one of SGLang's (``sglang_packed`` fp32, ``sglang_packed_bf16``, ``sglang_rs_bf16``)."""
    f32 = torch.float32
    if arm.startswith("ours_"):
        stack = Stack(shape, ArmSpec(f32, f32, arm, "ours_fp32"), "cuda")
        return stack, arm_step(stack, ctx["kernels"])
    if arm.startswith("copy_"):
        fmt, decode = copy_with(ctx["copy"][arm[5:]], shape)
        stack = Stack(shape, ArmSpec(f32, f32, "copy", f"copy_{fmt}", copy=fmt), "cuda")
        return stack, arm_step(stack, {"read_copy_decode": decode})
    stack = Stack(shape, ARMS[{"sglang_packed": "sglang_packed_fp32"}.get(arm, arm)], "cuda")
    return stack, arm_step(stack, ctx["kernels"])


def measure(shape: Shape, arm: str, ctx: dict[str, Any], samples: int) -> float:
    """Median us per layer-step of one window of ``arm`` captured and replayed ``samples`` times."""
    stack, step = build_arm(shape, arm, ctx)
    us, _ = replay_times(window(stack, step), samples)
    del stack, step
    return stats(us, shape.L * shape.layers)["median"]


def diff_to(shape: Shape, ctx: dict[str, Any], arm: str, ref: str) -> float:
    """Max abs difference of outputs and checkpoints after one eager window of ``arm`` and of ``ref`` from the
    same start (0.0: bit for bit)."""
    got = []
    for a in (ref, arm):
        stack, step = build_arm(shape, a, ctx)
        window(stack, step)()
        torch.cuda.synchronize()
        got.append((stack.out.float(), stack.state.float()))
    return max(float((x - y).abs().max()) for x, y in zip(got[0], got[1], strict=True))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sglang-root", type=Path, default=None, help="folder holding sglang/kernels/... (SGLang's files)")
    ap.add_argument("--models", nargs="+", default=["gdn", "kda"], choices=sorted(MODELS))
    ap.add_argument("--batches", type=int, nargs="+", default=[64])
    ap.add_argument("--config", action="append", default=[], help="ring: NAME=key:value,... (repeatable)")
    ap.add_argument("--copy-config", action="append", default=[], help="read copy: NAME=fmt:bf16,key:value,...")
    ap.add_argument("--no-ring", action="store_true", help="no ring arm (not even the default)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--budget-s", type=float, default=200.0, help="no round starts after this many seconds")
    ap.add_argument("--out", type=Path, default=Path("out/ring_configs"), help="writes OUT.json (and a line per row to stdout)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    configs = {} if args.no_ring else dict([("default", {})] + [parse_config(c) for c in args.config])
    copies = dict(parse_config(c, copy=True) for c in args.copy_config)
    kernels: dict[str, Callable[..., Any]] = {f"ring_decode_{n}": ring_with(o) for n, o in configs.items()}
    load: dict[str, Any] = {}
    if args.sglang_root is not None:
        try:
            from tests.support.ring_decode_baselines import load_sglang_kernels

            sgl = load_sglang_kernels(args.sglang_root, build_cuda=False)
            load = {"gdn": sgl.gdn_packed, "kda": sgl.kda_packed_triton, "rs": sgl.replayssm}
        except Exception as e:  # the run goes on without SGLang's arms
            print(f"SGLang's kernels not loaded: {type(e).__name__}: {e}", flush=True)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "configs": configs, "copy_configs": copies,
                           "rounds": args.rounds, "samples": args.samples, "layers": args.layers, "rows": []}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for model in args.models:
        for B in args.batches:
            shape = Shape(**MODELS[model], B=B, L=16, layers=args.layers)  # type: ignore[arg-type]
            arms = [f"ours_{n}" for n in configs] + [f"copy_{n}" for n in copies]
            if model in load:
                arms += ["sglang_packed"] + (["sglang_packed_bf16", "sglang_rs_bf16"] if copies else [])
            ctx = {"kernels": {**kernels, **({"sglang_packed": load[model], "sglang_rs": load["rs"]} if load else {})},
                   "copy": copies}  # fmt: skip
            row: dict[str, Any] = {"model": model, "B": B, "rounds": {a: [] for a in arms}, "max_abs_diff": {}}
            refs = {"ours": "ours_default", "copy": None}
            for arm in arms:
                kind = arm.split("_")[0]
                if kind not in refs:
                    continue
                if refs[kind] is None:
                    refs[kind] = arm  # the first read-copy config of its kind is the reference
                    continue
                if arm != refs[kind] and (kind == "ours" or copies[arm[5:]].get("fmt", "bf16") ==
                                          copies[refs[kind][5:]].get("fmt", "bf16")):  # fmt: skip
                    try:
                        row["max_abs_diff"][arm] = diff_to(shape, ctx, arm, refs[kind])  # type: ignore[arg-type]
                    except Exception as e:  # recorded, its rounds fail the same way
                        row["max_abs_diff"][arm] = f"{type(e).__name__}: {str(e)[:200]}"
            for r in range(args.rounds):
                if time.monotonic() - t0 > args.budget_s:
                    row["cut"] = f"budget at round {r}"
                    break
                for arm in arms[r % len(arms) :] + arms[: r % len(arms)]:  # rotated
                    try:
                        row["rounds"][arm].append(round(measure(shape, arm, ctx, args.samples), 2))
                    except Exception as e:
                        row.setdefault("errors", {})[arm] = f"{type(e).__name__}: {str(e)[:200]}"
            row["median"] = {a: statistics.median(v) for a, v in row["rounds"].items() if v}
            if "sglang_packed" in row["median"]:
                row["speedup_vs_packed"] = {a: row["median"]["sglang_packed"] / m for a, m in row["median"].items()}
            res["rows"].append(row)
            print(f"[{time.monotonic() - t0:5.1f}s] {model} B={B}: "
                  + ", ".join(f"{a} {m:.1f} ({min(row['rounds'][a]):.1f}-{max(row['rounds'][a]):.1f})"
                              + (f" {row['speedup_vs_packed'][a]:.2f}x" if "speedup_vs_packed" in row else "")
                              for a, m in row["median"].items())
                  + f"; max abs diff to the reference: {row['max_abs_diff']}"
                  + (f"; errors {row['errors']}" if "errors" in row else ""), flush=True)  # fmt: skip
            args.out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    res["elapsed_s"] = round(time.monotonic() - t0, 1)
    args.out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

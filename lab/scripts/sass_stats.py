"""Registers and per-iteration instruction mix of the ring-decode read kernels, without a GPU.

Compiles each kernel ahead of time for sm_90 (Triton's bundled ptxas), disassembles it with the
bundled nvdisasm and prints, per launch config: registers, spill stack, total SASS instructions,
and for each loop of more than 20 instructions its length and its SHFL / FP / LDG / shared-memory
/ barrier counts. The streamed-chunk loop is the one that matters: at decode sizes its length,
times chunks, times programs, is what the H200 spends its time issuing (notes/kernels.md).

Layouts depend on the Triton version; to see what the GPU box compiles, run with its version
(3.6.0) on the path, e.g. ``pip download triton==3.6.0`` for this Python, unzip it to /tmp/t36,
``chmod +x /tmp/t36/triton/backends/nvidia/bin/*`` and ``PYTHONPATH=/tmp/t36:. python
lab/scripts/sass_stats.py``.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sglang_replayssm.kernels.ring_decode_slices import ring_read_rows_kernel
from sglang_replayssm.kernels.ring_decode_triton import ring_decode_kernel

POINTERS = {
    "qkv": "*bf16", "a": "*bf16", "b": "*bf16", "A_log": "*fp32", "dt_bias": "*fp32", "out": "*bf16",
    "state": "*fp32", "d_ring": "*fp32", "k_ring": "*fp32", "g_ring": "*fp32", "slots": "*i32",
    "write_pos": "*i32", "force_flush": "*i32",
}  # fmt: skip
STRIDES = ("stride_qkv", "stride_a", "stride_b", "stride_state", "stride_d", "stride_k", "stride_g")
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def compile_sm90(fn: object, consts: dict, num_warps: int) -> bytes:
    """cubin of ``fn`` for sm_90; pointers and strides marked 16-divisible as the runtime does."""
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):  # type: ignore[attr-defined]
        if name in consts:
            sig[name] = "constexpr"
        elif name in POINTERS:
            sig[name], attrs[(i,)] = POINTERS[name], [["tt.divisibility", 16]]
        elif name in STRIDES:
            sig[name], attrs[(i,)] = "i32", [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": 1})
    return k.asm["cubin"]


def sass_stats(cubin: bytes) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        Path(path).write_bytes(cubin)
        res = subprocess.run([BIN / "cuobjdump", "--dump-resource-usage", path], capture_output=True, text=True)
        sass = subprocess.run([BIN / "nvdisasm", "-c", path], capture_output=True, text=True).stdout
    regs = int(re.search(r"REG:(\d+)", res.stdout).group(1))
    stack = int(re.search(r"STACK:(\d+)", res.stdout).group(1))
    ins: list[tuple[int | None, str]] = []
    for line in sass.splitlines():
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
        lab = re.match(r"\.(L_x_\d+):", line.strip())
        if lab:
            ins.append((None, lab.group(1)))
    label_at = {t: i for i, (a, t) in enumerate(ins) if a is None}
    loops = []
    for i, (a, t) in enumerate(ins):
        m = re.search(r"`\(\.(L_x_\d+)\)", t) if a is not None and "BRA" in t else None
        if m and label_at.get(m.group(1), i) < i:
            body = [x[1] for x in ins[label_at[m.group(1)] : i + 1] if x[0] is not None]
            if len(body) > 20:
                ops = collections.Counter(b.split()[1 if b.startswith("@") else 0].split(".")[0] for b in body)
                loops.append(
                    {
                        "n": len(body),
                        "shfl": ops["SHFL"],
                        "fp": ops["FFMA"] + ops["FMUL"] + ops["FADD"],
                        "ldg": ops["LDG"] + ops["LDGSTS"],
                        "smem": ops["LDS"] + ops["STS"] + ops["LDSM"],
                        "bar": ops["BAR"],
                    }
                )
    return {"regs": regs, "stack": stack, "sass": sum(1 for a, _ in ins if a is not None), "loops": loops}


def configs(is_kda: bool) -> list[tuple[str, object, dict, int]]:
    base = {"H": 32 if is_kda else 16, "HV": 32, "K": 128, "V": 128, "L": 16, "BC": 16, "IS_KDA": is_kda,
            "HAS_FF": False, "USE_L2NORM": True, "ROW_MAJOR": True}  # fmt: skip
    out = [
        ("rows bv8 w1 (non-flush pass)", ring_decode_kernel,
         dict(base, BVC=8, VPER=128, FLUSH_MODE=0, PF=1, PASS=1, EVICT=""), 1),
        ("rows bv8 w1 (flush pass)", ring_decode_kernel,
         dict(base, BVC=8, VPER=128, FLUSH_MODE=0, PF=1, PASS=2, EVICT=""), 1),
    ]  # fmt: skip
    for ks, bv, nw, ns, qf in [(16, 8, 1, 1, False), (32, 8, 1, 1, False), (16, 8, 1, 1, True), (16, 32, 4, 3, False)]:
        name = f"slices ks{ks} bv{bv} w{nw} ns{ns}{' qf' if qf else ''}"
        out.append((name, ring_read_rows_kernel, dict(base, BV=bv, KS=ks, VPER=128, QF=qf, PERM=False, NS=ns), nw))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gdn,kda")
    args = ap.parse_args()
    print(f"triton {triton.__version__}, sm_90")
    print("| model | kernel / config | regs | stack | SASS | loop: n / SHFL / FP / LDG / smem / BAR |")
    print("|---|---|---|---|---|---|")
    for model in args.models.split(","):
        for name, fn, consts, nw in configs(model == "kda"):
            st = sass_stats(compile_sm90(fn, consts, nw))
            loops = "; ".join(f"{x['n']} / {x['shfl']} / {x['fp']} / {x['ldg']} / {x['smem']} / {x['bar']}"
                              for x in st["loops"])  # fmt: skip
            print(f"| {model} | {name} | {st['regs']} | {st['stack']} | {st['sass']} | {loops} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

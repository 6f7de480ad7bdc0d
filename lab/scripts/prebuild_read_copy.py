"""Prebuild the read-copy CUDA builds a GPU run loads, here (nvcc, no GPU needed), for the GPU box.

    .venv/bin/python lab/scripts/prebuild_read_copy.py --out .devcarry/cuda --sweep table

Builds (sm_90a by default) every distinct build of :func:`sglang_replayssm.kernels.read_copy_cuda.default_config` over the
batch sizes the tests and benches use, of the GPU tests' launches (``tests/test_read_copy_cuda.py``,
listed below: keep them in step), and of the named sweeps of :mod:`tests.support.read_copy_bench`;
``--jobs`` at a time (2), each ~7-13 s. Carry the folder (``tar cJf``: ~11 MB for ~40 builds) and point
``SGLANG_REPLAYSSM_CUDA_CACHE`` at it on the box; a build it lacks is compiled there.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the product, tests.support, lab
from lab.kernels.read_copy_lab import LabReadCopyConfig, as_lab  # noqa: E402
from sglang_replayssm.kernels.read_copy_cuda import (  # noqa: E402
    ReadCopyCudaConfig,
    build,
    build_options,
    default_config,
)
from tests.support.read_copy_bench import SWEEPS, sweep_config  # noqa: E402

Key = tuple[str, tuple[tuple[str, int | bool], ...]]
#: the config classes by name: the product's builds, and the lab's (research options, the lab source)
KINDS: dict[str, type[ReadCopyCudaConfig]] = {k.__name__: k for k in (ReadCopyCudaConfig, LabReadCopyConfig)}


def build_key(c: ReadCopyCudaConfig) -> Key:
    """What selects a build (the launch-only fields left out): its config class and build options, in field order."""
    return type(c).__name__, tuple(build_options(c).items())


def test_configs() -> list[ReadCopyCudaConfig]:
    """The GPU tests' launches (their build fields; the research options': lab builds)."""
    C = LabReadCopyConfig
    out = [C(tc_flush=bool(tc), flush_prefetch=bool(pf), fp8_recip=bool(rc), stages=st, flush_rows=max(rows, 0),
             flush_pipe=rows < 0)
           for tc, pf, rc, st, rows in ((0, 0, 0, 0, 0), (1, 0, 0, 0, 0), (0, 1, 0, 0, 0), (1, 1, 0, 0, 0),
                                        (0, 1, 1, 0, 0), (1, 0, 1, 0, 0), (0, 1, 1, 4, 0), (0, 0, 1, 3, 0),
                                        (0, 0, 1, 6, 0), (0, 0, 1, 4, 2), (0, 0, 0, 0, 1), (0, 0, 1, 4, -1),
                                        (0, 0, 0, 0, -1), (0, 0, 0, 0, 2), (0, 0, 0, 4, 0), (0, 0, 0, 6, -1),
                                        (0, 0, 0, 3, 0))]  # fmt: skip
    for fm, rw, st, pair in ((12, 4, 4, 0), (0, 1, 4, 0), (12, 1, 0, 0), (0, 2, 0, 0), (0, 1, 4, 1), (0, 4, 4, 1),
                             (0, 1, 0, 1), (0, 4, 0, 1)):
        out.append(C(depth=2, min_blocks=4, flush_prefetch=not pair, fp8_recip=True, stages=st, flush_min_blocks=fm,
                     read_warps=rw, flush_pair=bool(pair)))
    out.append(C(flush_pair=True))
    for rw in (1, 4):  # tc_read
        out.append(C(depth=2, min_blocks=4, flush_prefetch=True, fp8_recip=True, stages=4, read_warps=rw, tc_read=True))
    out.append(C(stages=4, tc_read=True))
    out.append(C(stages=4, flush_tile=1))  # fp32 io
    for kda in (False, True):  # flush_tile on the register path and the staged default, read_rows beside it
        for fmt in ("bf16", "fp8"):
            d = default_config(512, 32, 16, kda, fmt)
            for t in (1, 2):
                out.append(C(depth=2, min_blocks=4, fp8_recip=True, flush_tile=t))
                out += [as_lab(d, flush_tile=t, flush_prefetch=t == 1, read_rows=rr) for rr in (False, True)]
    out.append(C(stages=4, read_rows=True))  # fp32 io
    for rw in (1, 4):  # read_rows, one- and four-warp blocks
        out.append(C(depth=2, min_blocks=4, flush_prefetch=True, fp8_recip=True, stages=4, read_warps=rw, read_rows=True))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--arch", default="90a")
    ap.add_argument("--sweep", nargs="*", default=["table"], choices=sorted(SWEEPS))
    ap.add_argument("--jobs", type=int, default=2, help="builds at a time (nvcc processes)")
    args = ap.parse_args()
    cfgs = test_configs()
    for B in (2, 12, 20, 64, 256, 320, 512):
        for kda in (False, True):
            for fmt in ("bf16", "fp8"):
                d = default_config(B, 32 if B > 20 else 4, 16, kda, fmt)
                cfgs += [d] + [as_lab(d, flush_parts=None, flush_rows=r, flush_tile=0) for r in (1, 2)]
    for name in args.sweep:
        cfgs += [sweep_config(t, parts=1) for t in SWEEPS[name]]
    keys = sorted({build_key(c) for c in cfgs})
    print(f"{len(keys)} builds into {args.out}", flush=True)

    def one(k: Key) -> None:
        print(build(args.arch, out_dir=args.out, kind=KINDS[k[0]], **dict(k[1])).name, flush=True)  # type: ignore[arg-type]

    with ThreadPoolExecutor(args.jobs) as ex:
        list(ex.map(one, keys))


if __name__ == "__main__":
    main()

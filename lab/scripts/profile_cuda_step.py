"""Run one ring-decode step of the CUDA passes a few times, for Nsight Compute to profile.

Usage (GPU box): ``ncu --clock-control none -k regex:ring_step --launch-skip 4 --launch-count 2
python3 lab/scripts/profile_cuda_step.py --model gdn --B 256 --m 0 --cfg '{"cuda_stages": 3}'``: the
third step's two launches (non-flush pass, flush pass) are profiled. Shapes and data are those of
the kernel benchmark's :class:`tests.support.kernel_bench.Problem`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the product, tests.support, lab
from lab.kernels.ring_decode_research import ring_decode_research  # noqa: E402
from tests.support.kernel_bench import Problem  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["gdn", "kda"], default="gdn")
    ap.add_argument("--B", type=int, default=256)
    ap.add_argument("--m", type=int, default=0, help="cursor of every row (L-1: a flush step)")
    ap.add_argument("--cfg", default="{}", help="JSON launch knobs (a sweep dict) for ring_decode_research")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    pb = Problem(args.model, args.B)
    cfg = {"engine": "cuda", **json.loads(args.cfg)}
    for _ in range(args.steps):
        pb.ring_step(ring_decode_research, args.m, tuning=cfg)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

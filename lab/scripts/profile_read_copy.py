"""Launch the read-copy decode step a few times for a profiler (GPU box, e.g. under ``ncu``).

    ncu --clock-control none --kernel-name regex:read_kernel --launch-skip 2 --launch-count 1 \
        python3 lab/scripts/profile_read_copy.py --model kda --batch 256 --fmt bf16 --cursor 0

``--cursor m``: every row at cursor ``m`` (0..L-2: the non-flush pass only; L-1: every row flushes);
``--cursor -1``: the staggered serving window (row r at (r + t) mod L). The launch is the product's
default (:func:`sglang_replayssm.kernels.read_copy_cuda.default_config`); ``--flush-rows N``: the same with
the row-layout flush pass at N blocks per SM (-1: pipelined). Needs CUDA.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the product, tests.support, lab
from lab.kernels.read_copy_lab import as_lab  # noqa: E402
from sglang_replayssm.kernels.read_copy_cuda import default_config, read_copy_decode_cuda  # noqa: E402
from tests.support.kernel_bench import L_RING  # noqa: E402
from tests.support.read_copy_bench import StaggeredProblem  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("gdn", "kda"), default="gdn")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--fmt", choices=("bf16", "fp8"), default="bf16")
    ap.add_argument("--cursor", type=int, default=0)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--flush-rows", type=int, default=0)
    a = ap.parse_args()
    pb = StaggeredProblem(a.model, a.batch)
    step = read_copy_decode_cuda
    if a.flush_rows:
        cfg = as_lab(default_config(a.batch, pb.HV, L_RING, pb.is_kda, a.fmt), flush_parts=None,
                     flush_rows=max(a.flush_rows, 0), flush_pipe=a.flush_rows < 0)
        step = functools.partial(read_copy_decode_cuda, config=cfg)
    for t in range(a.steps):
        if a.cursor < 0:
            wp = pb.stag[t % L_RING]
        else:
            wp = torch.full((a.batch,), a.cursor, dtype=torch.int32, device=pb.state.device)
        pb.copy_step(step, a.fmt, wp)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()

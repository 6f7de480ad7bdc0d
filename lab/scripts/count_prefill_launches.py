"""Count the torch ops the records room issues per GDN layer of a prefill, on CPU (no GPU needed).

(a) ``rebuild``: a prefix hit landing off the state grid, its records folded
(:func:`tests.support.launch_count.run_rebuild`); (b) ``capture``: a plain prefill's capture of the layer inputs
and kept interval states (:func:`tests.support.launch_count.run_capture`). SGLang's kernels count one launch
each; ``per layer`` is the slope between two layer counts, ``per forward`` the intercept. ``--per-layer-tensors``:
the pools as the unit tests build them (no stacks, what the code did before the stacks).

    PYTHONPATH=$PWD /work/main/.venv/bin/python lab/scripts/count_prefill_launches.py [--ops]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the product, tests.support
os.environ.setdefault("TRITON_INTERPRET", "1")  # SGLang's Triton conv on the CPU, as the tests run it

import torch  # noqa: E402

from tests.support.launch_count import run_capture, run_rebuild, slope  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, nargs=2, default=(2, 6), help="the two layer counts (slope)")
    parser.add_argument("--per-layer-tensors", action="store_true", help="pools without the layer stacks")
    parser.add_argument("--ops", action="store_true", help="list the ops of the larger run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lo, hi = args.layers
    stacked = not args.per_layer_tensors
    for phase, run in (("rebuild", functools.partial(run_rebuild, stacked=stacked)),
                       ("capture", functools.partial(run_capture, stacked=stacked))):
        for what in ("launches", "views"):
            per_layer, per_forward, big = slope(run, lo, hi, what)
            print(f"{phase:8s} {what:8s}: {per_layer:5.1f} per layer + {per_forward:5.1f} per forward")
            if args.ops:
                print(f"  {hi} layers:", dict(sorted(getattr(big, what).items())))


if __name__ == "__main__":
    main()

"""Count the torch ops of a short hit's rebuild (4 records past an interval state) on the two fold paths, on CPU.

``chunk``: the stacked chunk fold (every GDN layer's conv and extend at once; what stacked pools take for every span).
``sequential``: the token-by-token fold through SGLang's decode kernel, layer by layer (what unstacked pools take for
spans of at most ``REBUILD_SEQUENTIAL_TOKENS``), the kernel counted as one launch. Both at two layer counts, so the
per-layer slope shows (:mod:`tests.support.launch_count`).

    PYTHONPATH=$PWD .venv/bin/python lab/scripts/count_rebuild_paths.py [--layers 2 6 18]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the product, tests.support
os.environ.setdefault("TRITON_INTERPRET", "1")  # SGLang's Triton conv on the CPU, as the tests run it

import torch  # noqa: E402

from sglang_replayssm.radix import hooks  # noqa: E402
from sglang_replayssm.radix.records import rebuild as rb  # noqa: E402
from tests.support import launch_count as lc  # noqa: E402


@contextlib.contextmanager
def _sequential(counter_box: list[Any]) -> Iterator[None]:
    """Pools that fold spans of <= 32 records token by token, the decode kernel counted as one launch."""
    setup, fold = lc._setup, rb._fold_sequential

    @contextlib.contextmanager
    def with_sequential(n: int, counter: lc.OpCounter, stacked: bool) -> Iterator[tuple[Any, ...]]:
        counter_box.append(counter)
        with setup(n, counter, stacked) as parts:
            parts[4].sequential_tokens = 32
            yield parts

    lc._setup = with_sequential
    rb._fold_sequential = lambda *a, **k: counter_box[-1].kernel("sequential", lambda: None)()
    try:
        yield
    finally:
        lc._setup, rb._fold_sequential = setup, fold


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 6, 18])
    args = parser.parse_args()
    torch.set_num_threads(1)
    hooks.install()
    for layers in args.layers:
        chunk, _ = lc.run_rebuild(layers, stacked=True, depth=516)
        box: list[Any] = []
        with _sequential(box):
            seq, _ = lc.run_rebuild(layers, stacked=False, depth=516)
        print(f"{layers:3} GDN layers: chunk (stacked) {chunk.total()} ops, sequential (per layer) {seq.total()} ops")


if __name__ == "__main__":
    main()

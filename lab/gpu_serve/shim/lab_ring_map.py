"""Lab GPU machine only: with LAB_RING_MAP_CUDA=1 a server's mapped decode steps (rings keyed by request row)
take the CUDA passes' row-map build by default (``ring_decode_cuda.MAPPED_DEFAULT = True``), so that build can be
measured in the server beside the Triton engines before the product's default changes. A user's install never
puts this folder on PYTHONPATH."""

from __future__ import annotations

import os


def install() -> None:
    if os.environ.get("LAB_RING_MAP_CUDA") != "1":
        return
    from sglang_replayssm.kernels import ring_decode_cuda

    ring_decode_cuda.MAPPED_DEFAULT = True

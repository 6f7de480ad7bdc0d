"""The rebuild paths run once at startup, so the first prefix hit does not pay their first use.

A rebuild calls kernels no prefill calls with its shapes: the stacked gates and extend over every GDN layer's
heads at once, the stacked conv, SGLang's Triton decode kernel over varlen spans. Their first call compiles
or autotunes (about 0.6 s on the H200 at Qwen3-Next's shape): without a warm-up the server's first hit pays it.
Triton compiles an integer argument divisible by 16 as its own variant (the conv's and the extend's token
counts), so the chunk rebuild runs at two spans, one of each kind; the stacked conv's variant does not depend on
the count of jobs up to :data:`~.fold_stack.CONV_WORK_ROWS` (:func:`~.fold_stack.work_rows`).

:func:`warm_up` runs at the first forward after one forward captured every layer's records (SGLang's own
startup warmup request: its prefill captures, its first decode step warms up), once per pool: rebuilds of
:data:`CHUNK_RECORDS` records by the chunk kernels and, where short spans fold token by token
(``pool.sequential_tokens``), one of :data:`SEQUENTIAL_RECORDS`, both from the zero state (whether a span
starts from a state is a per-sequence tensor of the kernels, ``extend_prefix_lens`` / ``has_initial_state``,
not a compiled variant). Invariant: it writes only mamba slot 0, SGLang's padding slot (padded CUDA-graph
rows write there; no request or tree node owns it), and reads only the records' sink row; no record, kept
state, ring or owned slot changes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from sglang_replayssm.radix.records.match import Rebuild
from sglang_replayssm.radix.records.pool import RecordPool

__all__ = ["CHUNK_RECORDS", "PADDING_SLOT", "SEQUENTIAL_RECORDS", "warm_up"]

logger = logging.getLogger(__name__)

#: SGLang's reserved mamba slot (``MambaSlotAllocator`` never hands it out; padded rows write there).
PADDING_SLOT = 0
#: The chunk rebuild's spans: more than two of the extend's 64-token chunks, past the 3-record conv lead; token
#: counts not divisible by 16 and divisible by 16 (at any layer count), each a variant of Triton's.
CHUNK_RECORDS = (131, 128)
#: The sequential rebuild's span, at most ``pool.sequential_tokens``.
SEQUENTIAL_RECORDS = 8


def _job(pool: RecordPool, n: int) -> Rebuild:
    slot = torch.tensor([PADDING_SLOT], dtype=torch.int64, device=pool.device)
    sink = torch.full((n,), pool.capacity, dtype=torch.int64, device=pool.device)
    return Rebuild(dst=slot, src=None, slots=sink)


def warm_up(pool: RecordPool, req_pool: Any, rebuild: Callable[[RecordPool, Any, list[Rebuild]], None]) -> bool:
    """Run the warm-up rebuilds through ``rebuild`` (:func:`~.rebuild.rebuild`) if ``pool`` has records of every
    layer and has not warmed up; returns whether it ran (see the module docstring)."""
    if pool.warmed or not pool.layers or (pool.layer_ids and len(pool.layers) < len(pool.layer_ids)):
        return False
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return False
    pool.warmed = True
    spans = [*CHUNK_RECORDS] + ([min(SEQUENTIAL_RECORDS, pool.sequential_tokens)] if pool.sequential_tokens else [])
    t0 = time.perf_counter()
    for n in spans:
        rebuild(pool, req_pool, [_job(pool, n)])
    if pool.device.type == "cuda":
        torch.cuda.synchronize(pool.device)  # once, at startup: the time logged is the first use's
    logger.info("sglang-replayssm records: warm-up rebuilds of %s records into the padding slot took %.0f ms",
                ", ".join(map(str, spans)), 1e3 * (time.perf_counter() - t0))
    return True

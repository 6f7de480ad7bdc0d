"""The rebuild paths run once at startup, so no prefix hit pays a kernel's first use.

A rebuild calls kernels no prefill calls with its shapes: the stacked gates and extend over every GDN layer at once,
the stacked conv, SGLang's Triton decode kernel over varlen spans. Their first call compiles or autotunes (about
0.6 s on the H200 at Qwen3-Next's shape), and Triton compiles apart what a step's shape changes:

* an integer argument equal to 1, divisible by 16, or neither (the stacked conv's token count; Triton makes 1 a
  ``constexpr``): spans of 131 and 128 records, and on stacked pools one of 1 record;
* the row count of the stacked conv's work windows (a ``constexpr``; :func:`~.fold_stack.work_rows` buckets it): on
  CUDA, a step of the fewest jobs of every bucket a step of the pool's most jobs can use, at both token-count kinds
  (:func:`bucket_spans`), up to the largest bucket whose windows fit :data:`MAX_WARM_WINDOW_BYTES`;
* the extend's chunk-count bucket (``NT_BUCKET`` of SGLang's ``chunk_delta_h.py``: up to 32 chunks, up to 128,
  more; a stacked step's chunks are every layer's): the 8-record span (one chunk; stacked pools always run it), the
  128-record span and the bucket steps (at least :data:`MIN_WARM_JOBS` one-chunk jobs) reach all three at 4 to 32
  layers. FLA's chunk kernels take the token count itself unspecialized (``do_not_specialize``).

:func:`warm_up` runs at the first forward after one forward captured every layer's records (SGLang's own startup
warmup request: its prefill captures, its first decode step warms up), once per pool, every job from the zero state
(whether a span starts from a state is a per-sequence tensor of the kernels, ``extend_prefix_lens`` /
``has_initial_state``, not a compiled variant); the 8-record span folds token by token where spans so short do
(``pool.sequential_tokens``). Invariant: it writes only mamba slot 0, SGLang's padding slot (padded CUDA-graph rows
write there; no request or tree node owns it; a multi-job step's jobs all fold into it), and reads only the records'
sink row; no record, kept state, ring or owned slot changes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from sglang_replayssm.radix.records.fold_stack import CONV_WORK_ROWS, work_rows
from sglang_replayssm.radix.records.match import Rebuild
from sglang_replayssm.radix.records.pool import RecordPool

__all__ = ["BUCKET_SPAN", "CHUNK_RECORDS", "MAX_WARM_WINDOW_BYTES", "MIN_WARM_JOBS", "PADDING_SLOT", "SEQUENTIAL_RECORDS",
           "bucket_spans", "warm_up"]

logger = logging.getLogger(__name__)

#: SGLang's reserved mamba slot (``MambaSlotAllocator`` never hands it out; padded rows write there).
PADDING_SLOT = 0
#: The chunk rebuild's spans: more than two of the extend's 64-token chunks, past the 3-record conv lead; token
#: counts not divisible by 16 and divisible by 16 (at any layer count), each a variant of Triton's.
CHUNK_RECORDS = (131, 128)
#: The sequential rebuild's span, at most ``pool.sequential_tokens``.
SEQUENTIAL_RECORDS = 8
#: Records per job of the bucket warm-up steps (:func:`bucket_spans`).
BUCKET_SPAN = 8
#: The bucket steps on CUDA reach at least this many one-chunk jobs (the extend's chunk-count buckets, module docstring).
MIN_WARM_JOBS = 33
#: The bucket steps stop where the stacked conv's work windows would pass this many bytes (a step that large, rare,
#: compiles at its first use rather than every server holding the bytes at startup).
MAX_WARM_WINDOW_BYTES = 256 << 20


def bucket_spans(max_jobs: int) -> list[list[int]]:
    """The warm-up steps past the first conv bucket for steps of up to ``max_jobs`` jobs: per bucket of
    :func:`~.fold_stack.work_rows` rows, its fewest jobs (an odd count, ``rows / 2 + 1``) with spans of
    :data:`BUCKET_SPAN` records, once as they are (a token count not divisible by 16) and once with the first span
    doubled (divisible by 16)."""
    steps, rows = [], CONV_WORK_ROWS
    while rows < work_rows(max_jobs):
        rows *= 2
        jobs = rows // 2 + 1
        steps += [[BUCKET_SPAN] * jobs, [2 * BUCKET_SPAN] + [BUCKET_SPAN] * (jobs - 1)]
    return steps


def _job(pool: RecordPool, n: int) -> Rebuild:
    slot = torch.tensor([PADDING_SLOT], dtype=torch.int64, device=pool.device)
    sink = torch.full((n,), pool.capacity, dtype=torch.int64, device=pool.device)
    return Rebuild(dst=slot, src=None, slots=sink)


def _bucket_jobs(pool: RecordPool, req_pool: Any, max_jobs: int | None) -> int:
    """The most jobs the bucket steps reach: ``max_jobs`` (None: on CUDA the request rows of ``req_pool``, at
    least :data:`MIN_WARM_JOBS`; elsewhere 0), cut to the largest conv bucket whose work windows (rows x every
    layer's channels x the conv lead) fit :data:`MAX_WARM_WINDOW_BYTES`."""
    if max_jobs is None:
        cuda = pool.device.type == "cuda"
        max_jobs = max(int(getattr(req_pool, "size", 0) or 0), MIN_WARM_JOBS) if cuda else 0
    if pool.xs is not None:
        row_bytes = pool.xs.shape[0] * pool.xs.shape[-1] * max(pool.conv_lead, 1) * pool.xs.element_size()
        rows = max(MAX_WARM_WINDOW_BYTES // row_bytes, 1)
        max_jobs = min(max_jobs, max(CONV_WORK_ROWS, 1 << (rows.bit_length() - 1)))
    return max_jobs


def warm_up(pool: RecordPool, req_pool: Any, rebuild: Callable[[RecordPool, Any, list[Rebuild]], None],
            max_jobs: int | None = None) -> bool:
    """Run the warm-up rebuilds through ``rebuild`` (:func:`~.rebuild.rebuild`) if ``pool`` has records of every
    layer and has not warmed up; returns whether it ran (see the module docstring). ``max_jobs``: the most rebuilds
    one step can hold (None: on CUDA the request rows of ``req_pool``, at least :data:`MIN_WARM_JOBS`; elsewhere no
    bucket step); at most as many as fit work windows of :data:`MAX_WARM_WINDOW_BYTES`."""
    if pool.warmed or not pool.layers or (pool.layer_ids and len(pool.layers) < len(pool.layer_ids)):
        return False
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return False
    pool.warmed = True
    stacked = pool.stacked_ab() is not None
    short = min(SEQUENTIAL_RECORDS, pool.sequential_tokens) if pool.sequential_tokens else (
        SEQUENTIAL_RECORDS if stacked else 0)  # token by token where spans so short do; stacked: one chunk
    spans = [*CHUNK_RECORDS] + ([short] if short else []) + ([1] if stacked else [])  # the conv's token count 1
    buckets = bucket_spans(_bucket_jobs(pool, req_pool, max_jobs)) if stacked else []
    steps = [[n] for n in spans] + buckets
    t0 = time.perf_counter()
    for step in steps:
        rebuild(pool, req_pool, [_job(pool, n) for n in step])
    if pool.device.type == "cuda":
        torch.cuda.synchronize(pool.device)  # once, at startup: the time logged is the first use's
    logger.info("sglang-replayssm records: warm-up rebuilds of %s records%s into the padding slot took %.0f ms",
                ", ".join(map(str, spans)), f" and steps of {', '.join(str(len(s)) for s in buckets[::2])} jobs"
                if buckets else "",
                1e3 * (time.perf_counter() - t0))
    return True

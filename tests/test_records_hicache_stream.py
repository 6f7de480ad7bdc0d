"""The records' HiCache backup runs on a side stream that starts late (behind SGLang's write fence): index
tensors it reads were made on the scheduler's stream and must not be handed out again before it ran
(``host_records._transfer``'s ``reads``). CUDA only (the race needs two streams); runs on the lab H200."""

from __future__ import annotations

import pytest
import torch

from sglang_replayssm.radix.records.hicache.host_records import HiCacheRecords, _transfer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (two streams)")

N = 1 << 16


def _submit(state: HiCacheRecords, fence: torch.cuda.Stream, table: torch.Tensor, out: torch.Tensor,
            protect: bool) -> int:
    """``out = table[src]`` on the side stream, ``src`` made here on the current stream and dropped on
    return (as ``backed_up`` drops its indices); returns ``src``'s address."""
    src = torch.arange(N, device="cuda", dtype=torch.int64)

    def body() -> None:
        out.copy_(table.index_select(0, src))

    _transfer(state, fence, body, reads=(src,) if protect else ())
    return src.data_ptr()


def _late_gather(protect: bool) -> tuple[torch.Tensor, bool]:
    """Gather on the side stream while the fence holds it back, then zero a tensor of the indices' size on
    the current stream; returns (what the gather read, whether the zeroed tensor got the indices' memory)."""
    state = HiCacheRecords()
    fence = torch.cuda.Stream()
    table = torch.arange(N, device="cuda", dtype=torch.int64) * 10
    out = torch.empty(N, device="cuda", dtype=torch.int64)
    # Every kernel below loaded once first: a lazily loaded kernel's first launch can wait for the device,
    # which would let the side stream finish before the call returns (no race to see).
    out.copy_(table.index_select(0, torch.arange(N, device="cuda", dtype=torch.int64)))
    torch.zeros(N, device="cuda", dtype=torch.int64)
    torch.cuda.synchronize()
    with torch.cuda.stream(fence):
        torch.cuda._sleep(100_000_000)  # tens of ms: the side stream starts long after the call returns
    ptr = _submit(state, fence, table, out, protect)
    zeroed = torch.zeros(N, device="cuda", dtype=torch.int64)  # the next work on the scheduler's stream
    torch.cuda.synchronize()
    return out.cpu(), zeroed.data_ptr() == ptr


def test_the_side_stream_reads_the_indices_it_was_given():
    got, _ = _late_gather(protect=True)
    assert torch.equal(got, torch.arange(N, dtype=torch.int64) * 10)


def test_without_the_guard_the_indices_are_overwritten_before_the_side_stream_reads_them():
    got, reused = _late_gather(protect=False)
    assert reused  # the allocator handed src's block to the next tensor of its size
    assert not torch.equal(got, torch.arange(N, dtype=torch.int64) * 10)

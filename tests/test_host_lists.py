"""``host_lists.on_device``: host lists on the device without a stream sync (CPU: values; CUDA: no sync)."""

from __future__ import annotations

import pytest
import torch

from sglang_replayssm.host_lists import on_device


def test_values_and_dtype_on_cpu():
    t = on_device([3, 1, 2], torch.int32, "cpu")
    assert t.dtype == torch.int32 and t.tolist() == [3, 1, 2]
    assert on_device([True, False], torch.bool, torch.device("cpu")).tolist() == [True, False]
    assert on_device([], torch.int64, "cpu").numel() == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_no_stream_sync_on_cuda():
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        t = on_device(list(range(1000)), torch.int64, "cuda")
        with pytest.raises(RuntimeError):  # what it replaces: a pageable copy syncs the stream
            torch.tensor(list(range(1000)), dtype=torch.int64, device="cuda")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert t.cpu().tolist() == list(range(1000))


def test_several_lists_in_one_buffer_each_at_an_aligned_offset():
    """``packed`` / ``unpacked`` (what ``on_device_many`` copies at once on CUDA): every list back in its dtype,
    each starting at a multiple of ``ALIGN`` bytes, empty lists included; off CUDA, plain tensors."""
    from sglang_replayssm.host_lists import ALIGN, on_device_many, packed, unpacked

    lists = [([0, 3, 7], torch.int32), ([True, False, True], torch.bool), ([], torch.int64), ([5, -2], torch.int64)]
    buffer, where = packed(lists)
    assert buffer.dtype == torch.uint8 and buffer.numel() % ALIGN == 0
    assert all(at % ALIGN == 0 for at, _, _ in where)
    got = unpacked(buffer, where)
    assert [(t.dtype, t.tolist()) for t in got] == [(dtype, list(values)) for values, dtype in lists]
    assert all((t.data_ptr() - buffer.data_ptr()) % ALIGN == 0 for t in got)
    plain = on_device_many(lists, "cpu")
    assert [(t.dtype, t.tolist()) for t in plain] == [(dtype, list(values)) for values, dtype in lists]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_several_lists_in_one_copy_on_cuda():
    from sglang_replayssm.host_lists import ALIGN, on_device_many

    lists = [(list(range(100)), torch.int32), ([True] * 3, torch.bool), (list(range(7)), torch.int64)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = on_device_many(lists, "cuda")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [(t.dtype, t.cpu().tolist()) for t in got] == [(dtype, list(values)) for values, dtype in lists]
    assert all(t.data_ptr() % ALIGN == 0 for t in got)

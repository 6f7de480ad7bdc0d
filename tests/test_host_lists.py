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

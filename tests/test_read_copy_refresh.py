"""The stale-copy refresh (kernels/read_copy_refresh.py): Triton (interpreted on CPU) and torch twins
of one contract, and the refreshed copy against the fp64 checkpoint."""

from __future__ import annotations

import os

import pytest
import torch

from sglang_replayssm.kernels.read_copy_format import alloc_read_copy, dequantize
from sglang_replayssm.kernels.read_copy_refresh import refresh_stale_torch, refresh_stale_triton


def _case(fmt: str, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n, HV, V, K = 9, 2, 32, 16
    state64 = torch.randn(n, HV, V, K, generator=g, dtype=torch.float64) * torch.logspace(-3, 1, V, dtype=torch.float64)[:, None]
    state = state64.float().to(device)
    copy, scales = alloc_read_copy(n, HV, V, K, fmt, False, device=device)  # type: ignore[arg-type]
    copy.copy_((torch.randn(n, HV, V, K, generator=g) * 7).to(copy.dtype))  # garbage: stale copies
    if scales is not None:
        scales.fill_(3.0)
    stale = torch.tensor([1, 0, 1, 1, 0, 1, 0, 1, 1], dtype=torch.bool, device=device)
    slots = torch.tensor([3, -1, 1, 5, 7, -1, 0], dtype=torch.int32, device=device)  # 2 padding rows
    return state64, state, copy, scales, stale, slots


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_torch_twin_refreshes_exactly_the_stale_rows(fmt: str) -> None:
    state64, state, copy, scales, stale, slots = _case(fmt, "cpu")
    before = copy.clone()
    refresh_stale_torch(state, copy, scales, stale, slots)
    # rows 3, 5, 7, 0 are stale and in the batch; 1 is in the batch but fresh; 2, 8 stale but absent
    assert stale.tolist() == [False, False, True, False, False, False, False, False, True]
    for s in (1, 2, 4, 6, 8):
        assert torch.equal(copy[s].view(torch.uint8), before[s].view(torch.uint8)), s
    for s in (0, 3, 5, 7):
        back = dequantize(copy[s], None if scales is None else scales[s], False).double()
        tol = 2.0**-8 if fmt == "bf16" else 2.0**-4
        amax = state64[s].abs().amax(-1, keepdim=True)
        ref = state64[s]
        err = (back - ref).abs() / (ref.abs() if fmt == "bf16" else amax)
        assert float(err.max()) <= tol, s  # the copy of the fp64 checkpoint, to its format's precision


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                    reason="Triton needs CUDA or TRITON_INTERPRET=1")  # fmt: skip
@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_triton_twin_equals_torch_twin(fmt: str) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    _, state, c1, s1, st1, slots = _case(fmt, device)
    c2, s2, st2 = c1.clone(), None if s1 is None else s1.clone(), st1.clone()
    refresh_stale_torch(state, c1, s1, st1, slots)
    refresh_stale_triton(state, c2, s2, st2, slots)
    assert torch.equal(st1, st2)
    assert torch.equal(c1.view(torch.uint8), c2.view(torch.uint8))
    if s1 is not None:
        assert s2 is not None and torch.equal(s1, s2)


def test_bad_arguments_are_refused() -> None:
    _, state, copy, scales, stale, slots = _case("bf16", "cpu")
    with pytest.raises(ValueError, match="stale must be bool"):
        refresh_stale_torch(state, copy, scales, stale.int(), slots)
    with pytest.raises(ValueError, match="copy must be"):
        refresh_stale_torch(state, copy.float(), scales, stale, slots)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_triton_refresh_replays_in_a_cuda_graph(fmt: str) -> None:
    """Captured once, replayed after the flags and checkpoints change: the torch twin's result each time."""
    _, state, c1, s1, st1, slots = _case(fmt, "cuda")
    c2, s2, st2 = c1.clone(), None if s1 is None else s1.clone(), st1.clone()
    warm = (c2.clone(), None if s2 is None else s2.clone(), st2.clone())
    refresh_stale_triton(state, *warm, slots)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        refresh_stale_triton(state, c2, s2, st2, slots)
    for round_ in range(2):
        graph.replay()
        refresh_stale_torch(state, c1, s1, st1, slots)
        torch.cuda.synchronize()
        assert torch.equal(st1, st2), round_
        assert torch.equal(c1.view(torch.uint8), c2.view(torch.uint8)), round_
        state.mul_(0.5).add_(1.0)  # new checkpoints; slots 3 and 0 entered use again
        for st in (st1, st2):
            st[torch.tensor([3, 0], device="cuda")] = True

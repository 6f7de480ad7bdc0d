"""Device-side cursor step (sglang_replayssm.kernels.cursor) vs SGLang 0.5.23's host-side advance.

The reference is SGLang's own ``MambaAttnBackendBase._forward_metadata`` decode branch, called
with a minimal stand-in backend / forward batch on CPU. Both implementations (tensor ops, and the
Triton kernel under the interpreter on CPU or compiled on CUDA) must produce SGLang's cursor
snapshot, forced-flush mask and advanced per-slot cursors, including padded (-1) and duplicate
slots. On CUDA the Triton and torch steps are also captured in a CUDA graph and replayed.
"""

from __future__ import annotations

import types

import pytest
import torch

from sglang_replayssm.kernels.cursor import (
    cursor_step,
    cursor_step_torch,
    cursor_step_triton,
    force_flush_mask,
    next_cursor,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
IMPLS = {"torch": cursor_step_torch, "triton": cursor_step_triton}


def _load_backend_module() -> types.ModuleType | None:
    try:
        import sglang.srt.layers.attention.hybrid_linear_attn_backend as mod
    except Exception:  # pragma: no cover - SGLang not importable here (e.g. the GPU box)
        return None
    return mod


_MOD = _load_backend_module()


class _Mode:
    """Forward mode stand-in: plain decode."""

    def is_decode_or_idle(self) -> bool:
        return True

    def is_extend(self, *args: object, **kwargs: object) -> bool:
        return False

    def is_target_verify(self) -> bool:
        return False


def sglang_host_advance(
    write_pos_buf: torch.Tensor, slots: torch.Tensor, L: int, seq_lens: torch.Tensor, interval: int, is_kda: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run SGLang's ``_forward_metadata`` decode branch on CPU; returns (wp snapshot, ff) and
    advances ``write_pos_buf`` in place exactly as SGLang does."""
    assert _MOD is not None
    base = _MOD.MambaAttnBackendBase
    pool = types.SimpleNamespace(
        replayssm_write_pos=write_pos_buf,
        enable_linear_replayssm=True,
        linear_replayssm_cache_len=L,
        replayssm_is_kda=is_kda,
    )
    req_pool = types.SimpleNamespace(
        mamba_pool=pool,
        get_mamba_indices=lambda idx: slots[idx],
        translate_mamba_indices=lambda x: x,
    )

    forward_metadata = base._forward_metadata
    while getattr(forward_metadata, "__wrapped__", None) is not None:  # SGLang's own, not the adapter's hooks
        forward_metadata = forward_metadata.__wrapped__

    class FakeBackend:
        _forward_metadata = forward_metadata
        _translate_mamba_indices = base._translate_mamba_indices
        _has_cpu_prefill_track_metadata = staticmethod(base._has_cpu_prefill_track_metadata)
        _replayssm_track_flush_mask = base._replayssm_track_flush_mask

        def __init__(self) -> None:
            self.req_to_token_pool = req_pool
            self.device = "cpu"

    B = slots.shape[0]
    fb = types.SimpleNamespace(
        batch_size=B,
        logical_forward_mode=_Mode(),
        forward_mode=_Mode(),
        req_pool_indices=torch.arange(B),
        mamba_track_indices=None,
        mamba_track_mask=None,
        mamba_prefill_track_mask_cpu=None,
        seq_lens_cpu=seq_lens.cpu(),
    )
    saved = _MOD.get_exec
    _MOD.get_exec = lambda: types.SimpleNamespace(mamba=types.SimpleNamespace(mamba_track_interval=interval))
    try:
        meta = FakeBackend()._forward_metadata(fb)
    finally:
        _MOD.get_exec = saved
    ff = meta.replayssm_force_flush
    return meta.replayssm_write_pos, (None if ff is None else ff.to(torch.int32))


def _case(seed: int, B: int, N: int, L: int, dup: bool, pad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    slots = torch.randperm(N, generator=g)[:B].to(torch.int32)
    if dup and B >= 4:
        slots[B // 2] = slots[0]  # a duplicate pair
    if pad and B >= 3:
        slots[-1] = -1
        slots[1] = -1
    wp = torch.randint(0, L, (N,), generator=g, dtype=torch.int32)
    seq = torch.randint(1, 64, (B,), generator=g)
    if dup and B >= 4:
        seq[B // 2] = seq[0]  # rows sharing a slot share a request length (SGLang's assumption)
    return slots, wp, seq


@pytest.mark.skipif(_MOD is None, reason="SGLang backend module not importable")
@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("is_kda", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_matches_sglang_host_advance(impl: str, is_kda: bool, seed: int) -> None:
    L, N, B, interval = 4, 40, 12, 4
    slots, wp0, seq = _case(seed, B, N, L, dup=seed % 2 == 0, pad=seed >= 1)
    ref_buf = wp0.clone()
    ref_wp, ref_ff = sglang_host_advance(ref_buf, slots.to(torch.int64), L, seq, interval, is_kda)

    buf = wp0.clone().to(DEV)
    wp, ff = IMPLS[impl](
        buf,
        slots.to(DEV),
        L,
        seq_lens=None if is_kda else seq.to(DEV),
        track_interval=None if is_kda else interval,
    )
    assert torch.equal(wp.cpu(), ref_wp.to(torch.int32))
    if is_kda:
        assert ff is None and ref_ff is None
    else:
        assert ff is not None and ref_ff is not None
        assert torch.equal(ff.cpu(), ref_ff)
    assert torch.equal(buf.cpu(), ref_buf)


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_disagreeing_duplicates_flush_wins(impl: str) -> None:
    L = 8
    buf = torch.tensor([5, 3, 7, 0], dtype=torch.int32, device=DEV)
    slots = torch.tensor([1, 1, 2, -1, 2], dtype=torch.int32, device=DEV)
    seq = torch.tensor([10, 16, 3, 16, 5], device=DEV)  # row 1 forces a flush of slot 1, row 0 does not
    wp, ff = IMPLS[impl](buf, slots, L, seq_lens=seq, track_interval=8)
    assert wp.cpu().tolist() == [3, 3, 7, 5, 7]
    assert ff is not None and ff.cpu().tolist() == [0, 1, 0, 1, 0]
    # slot 1: min(4, 0) = 0; slot 2: wp 7 == L-1 -> 0; slot 0 (pad clamp target) and 3 untouched
    assert buf.cpu().tolist() == [5, 0, 0, 0]


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_out_buffers_and_short_seq_lens(impl: str) -> None:
    L = 4
    buf = torch.tensor([1, 2, 3, 0, 1], dtype=torch.int32, device=DEV)
    slots = torch.tensor([4, 0, 2], dtype=torch.int32, device=DEV)
    wp_out = torch.full((8,), -7, dtype=torch.int32, device=DEV)
    ff_out = torch.full((8,), -7, dtype=torch.int32, device=DEV)
    seq = torch.tensor([8, 8], device=DEV)  # shorter than B: row 2 gets no forced flush
    wp, ff = IMPLS[impl](buf, slots, L, seq_lens=seq, track_interval=4, wp_out=wp_out, ff_out=ff_out)
    assert wp.data_ptr() == wp_out.data_ptr() and ff is not None and ff.data_ptr() == ff_out.data_ptr()
    assert wp_out.cpu().tolist() == [1, 1, 3, -7, -7, -7, -7, -7]
    assert ff_out.cpu().tolist() == [1, 1, 0, -7, -7, -7, -7, -7]
    assert buf.cpu().tolist() == [0, 2, 0, 0, 0]


def test_helpers() -> None:
    wp = torch.tensor([0, 3, 2, 1], dtype=torch.int32)
    ff = torch.tensor([0, 0, 1, 0], dtype=torch.int32)
    assert next_cursor(wp, ff, 4).tolist() == [1, 0, 0, 2]
    assert next_cursor(wp, None, 4).tolist() == [1, 0, 3, 2]
    assert force_flush_mask(torch.tensor([4, 5, 8]), 5, 4).tolist() == [1, 0, 1, 0, 0]
    with pytest.raises(ValueError):
        force_flush_mask(torch.tensor([4]), 1, 0)
    buf = torch.zeros(3, dtype=torch.int32)
    empty_wp, empty_ff = cursor_step(buf, torch.empty(0, dtype=torch.int32), 4)
    assert empty_wp.numel() == 0 and empty_ff is None and buf.tolist() == [0, 0, 0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_cuda_graph_replay_matches_eager(impl: str) -> None:
    L, N, B, interval, steps = 16, 600, 512, 5, 40
    g = torch.Generator().manual_seed(7)
    slots = torch.randperm(N, generator=g)[:B].to(torch.int32).cuda()
    slots[::37] = -1
    seq0 = torch.randint(1, 100, (B,), generator=g).cuda()
    wp0 = torch.randint(0, L, (N,), generator=g, dtype=torch.int32).cuda()

    eager_buf = wp0.clone()
    eager = []
    for t in range(steps):
        wp, ff = IMPLS[impl](eager_buf, slots, L, seq_lens=seq0 + t, track_interval=interval)
        eager.append((wp.clone(), ff.clone() if ff is not None else None))

    buf = wp0.clone()
    seq_static = seq0.clone()
    wp_out = torch.empty(B, dtype=torch.int32, device="cuda")
    ff_out = torch.empty(B, dtype=torch.int32, device="cuda")
    # warm up (compiles the Triton kernel) on a scratch copy, then capture
    scratch = wp0.clone()
    IMPLS[impl](scratch, slots, L, seq_lens=seq_static, track_interval=interval, wp_out=wp_out, ff_out=ff_out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        IMPLS[impl](buf, slots, L, seq_lens=seq_static, track_interval=interval, wp_out=wp_out, ff_out=ff_out)
    buf.copy_(wp0)
    for t in range(steps):
        seq_static.copy_(seq0 + t)
        graph.replay()
        assert torch.equal(wp_out, eager[t][0])
        assert torch.equal(ff_out, eager[t][1])
    assert torch.equal(buf, eager_buf)

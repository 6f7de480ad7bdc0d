"""Torch reference for ReplaySSM *materialize*: fold ring records into a checkpoint, all layers at once.

For each row ``i`` with ``s = src[i]``, ``t = dst[i]``, ``c = counts[i]`` and every layer ``l``::

    S = temporal[l, s]                                      (fp32 copy)
    for j in 0..c-1:  S = S . Diag(exp(g[l, s, :, j])) + d[l, s, :, j] k[l, s, h(hv), j]^T
    temporal[l, t] = S                                      (cast to temporal.dtype)

with ``h(hv) = hv // (HV // H)``; GDN ``g`` is one scalar per value head, KDA one per K channel.
The ring is linear from position 0 (a flush resets the cursor to 0), so records ``0..c-1`` are the
live ones when ``c`` is the slot's ``write_pos``; records ``c..L-1`` never contribute (NaN there is harmless).

Arithmetic is the sequential fold in fp32, identical in order to the Triton kernel in
:mod:`sglang_replayssm.kernels.materialize_triton`. Shapes and invariants: see
:func:`check_materialize_args`, shared by both implementations.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["MaterializeCall", "check_materialize_args", "materialize_torch"]


@dataclass(frozen=True)
class MaterializeCall:
    """One checked materialize call (:func:`check_materialize_args`): the pool tensors, the rows, the
    gate kind and the dimensions ``(n_layers, R, H, HV, K, V, L)``. Backends take only this."""

    temporal: torch.Tensor
    ring_d: torch.Tensor
    ring_k: torch.Tensor
    ring_g: torch.Tensor
    src_slots: torch.Tensor
    dst_slots: torch.Tensor
    counts: torch.Tensor
    is_kda: bool
    dims: tuple[int, int, int, int, int, int, int]
    ring_src: torch.Tensor | None = None

    @property
    def ring_rows(self) -> torch.Tensor:
        """The ring row each row's records are read from: ``ring_src``, or ``src_slots`` (one ring per slot)."""
        return self.src_slots if self.ring_src is None else self.ring_src


def check_materialize_args(
    temporal: torch.Tensor,
    ring_d: torch.Tensor,
    ring_k: torch.Tensor,
    ring_g: torch.Tensor,
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
    counts: torch.Tensor,
    *,
    is_kda: bool,
    check_values: bool = True,
    ring_src: torch.Tensor | None = None,
) -> MaterializeCall:
    """Validate a materialize call; returns it checked, with ``dims = (n_layers, R, H, HV, K, V, L)``.

    Shapes: ``temporal`` ``[n_layers, slots, HV, V, K]``; ``ring_d`` ``[n_layers, slots, HV, L, V]``;
    ``ring_k`` ``[n_layers, slots, H, L, K]`` with ``HV % H == 0``; ``ring_g`` float32
    ``[n_layers, slots, HV, L]`` (GDN) or ``[n_layers, slots, HV, L, K]`` (KDA); ``src_slots``,
    ``dst_slots``, ``counts`` 1-D integer ``[R]`` on the pool's device. The last three dims of every
    pool tensor must be contiguous (any layer/slot strides are fine, e.g. views of a larger pool).

    With ``check_values`` (reads the index tensors on the host): every row with ``src >= 0`` and
    ``dst >= 0`` (a *live* row) has ``src, dst < slots`` and ``0 <= count <= L``; destination slots
    of live rows are pairwise distinct; and no live row's destination is another live row's source
    (reads and writes of different rows never overlap, so rows can run in any order). A row may
    have ``dst == src`` (in-place fold).

    ``ring_src`` (1-D integer ``[R]``): the ring row each row's records are read from, when the ring
    tensors hold their own rows (``[n_layers, rows, ...]``, any row count) instead of one per slot.
    """
    if temporal.dim() != 5:
        raise ValueError(f"temporal must be [n_layers, slots, HV, V, K], got {tuple(temporal.shape)}")
    n_layers, n_slots, HV, V, K = temporal.shape
    if ring_d.dim() != 5 or ring_k.dim() != 5:
        raise ValueError(f"ring_d/ring_k must be 5-D, got {tuple(ring_d.shape)}, {tuple(ring_k.shape)}")
    L = ring_d.shape[3]
    H = ring_k.shape[2]
    n_ring = n_slots if ring_src is None else ring_d.shape[1]
    if tuple(ring_d.shape) != (n_layers, n_ring, HV, L, V):
        raise ValueError(f"ring_d must be {(n_layers, n_ring, HV, L, V)}, got {tuple(ring_d.shape)}")
    if H <= 0 or HV % H != 0 or tuple(ring_k.shape) != (n_layers, n_ring, H, L, K):
        raise ValueError(f"ring_k must be {(n_layers, n_ring, 'H', L, K)} with HV % H == 0, got {tuple(ring_k.shape)}")
    g_shape = (n_layers, n_ring, HV, L, K) if is_kda else (n_layers, n_ring, HV, L)
    if tuple(ring_g.shape) != g_shape:
        raise ValueError(f"ring_g must be {g_shape} (is_kda={is_kda}), got {tuple(ring_g.shape)}")
    if ring_g.dtype != torch.float32:
        raise ValueError(f"ring_g must be float32, got {ring_g.dtype}")
    for name, t, inner in (
        ("temporal", temporal, 3), ("ring_d", ring_d, 3), ("ring_k", ring_k, 3), ("ring_g", ring_g, 3 if is_kda else 2)
    ):  # fmt: skip
        if t.device != temporal.device:
            raise ValueError(f"{name} is on {t.device}, temporal on {temporal.device}")
        expect = 1
        for dim in range(t.dim() - 1, t.dim() - 1 - inner, -1):
            if t.shape[dim] > 1 and t.stride(dim) != expect:
                raise ValueError(f"{name}: the last {inner} dims must be contiguous (strides {t.stride()})")
            expect *= t.shape[dim]
    R = src_slots.shape[0] if src_slots.dim() == 1 else -1
    named = (("src_slots", src_slots), ("dst_slots", dst_slots), ("counts", counts))
    for name, t in named + ((("ring_src", ring_src),) if ring_src is not None else ()):
        if t.dim() != 1 or t.shape[0] != R or t.dtype.is_floating_point or t.dtype == torch.bool:
            raise ValueError(f"{name} must be a 1-D integer tensor of length {R}, got {t.dtype} {tuple(t.shape)}")
        if t.device != temporal.device:
            raise ValueError(f"{name} is on {t.device}, temporal on {temporal.device}")
    if check_values and R > 0:
        src, dst, cnt = (t.tolist() for t in (src_slots, dst_slots, counts))
        ring = src if ring_src is None else ring_src.tolist()
        live = [i for i in range(R) if src[i] >= 0 and dst[i] >= 0]
        for i in live:
            if src[i] >= n_slots or dst[i] >= n_slots:
                raise ValueError(f"row {i}: slot index out of range ({src[i]} -> {dst[i]}, {n_slots} slots)")
            if not 0 <= cnt[i] <= L:
                raise ValueError(f"row {i}: count {cnt[i]} outside [0, {L}]")
            if cnt[i] > 0 and not 0 <= ring[i] < n_ring:
                raise ValueError(f"row {i}: ring row {ring[i]} outside [0, {n_ring})")
        dsts = [dst[i] for i in live]
        if len(set(dsts)) != len(dsts):
            raise ValueError(f"destination slots of live rows must be distinct, got {dsts}")
        for i in live:
            for j in live:
                if i != j and dst[i] == src[j]:
                    raise ValueError(f"row {i} writes slot {dst[i]} that row {j} reads")
    return MaterializeCall(temporal, ring_d, ring_k, ring_g, src_slots, dst_slots, counts, is_kda,
                           (n_layers, R, H, HV, K, V, L), ring_src)


def materialize_torch(call: MaterializeCall) -> None:
    """In-place ``temporal[:, dst[i]] = fold(temporal[:, src[i]], first counts[i] records of src[i])``.

    Rows with ``src < 0`` or ``dst < 0`` are skipped; ``count == 0`` copies bit-exactly; the ring
    tensors and source checkpoints are only read. See the module docstring for the math and
    :func:`check_materialize_args` for shapes and invariants.
    """
    temporal, ring_d, ring_k, ring_g = call.temporal, call.ring_d, call.ring_k, call.ring_g
    src_slots, dst_slots, counts, is_kda = call.src_slots, call.dst_slots, call.counts, call.is_kda
    _, _, H, HV, _, _, _ = call.dims
    live = torch.nonzero((src_slots >= 0) & (dst_slots >= 0)).flatten()
    if live.numel() == 0:
        return
    src = src_slots[live].long()
    dst = dst_slots[live].long()
    cnt = counts[live].long()
    S = temporal[:, src].to(torch.float32)  # [n_layers, n, HV, V, K]
    n_steps = int(cnt.max())
    if n_steps > 0:
        ring = call.ring_rows[live].long().clamp(min=0)  # rows with count 0 read nothing of theirs
        d = ring_d[:, ring, :, :n_steps].to(torch.float32)  # [n_layers, n, HV, c, V]
        k = ring_k[:, ring, :, :n_steps].to(torch.float32).repeat_interleave(HV // H, dim=2)  # [.., HV, c, K]
        g = ring_g[:, ring, :, :n_steps]  # [n_layers, n, HV, c(, K)]
        for j in range(n_steps):
            on = (j < cnt)[None, :, None, None, None]
            decay = torch.exp(g[:, :, :, j])[..., None, :] if is_kda else torch.exp(g[:, :, :, j])[..., None, None]
            folded = S * decay + d[:, :, :, j, :, None] * k[:, :, :, j, None, :]
            S = torch.where(on, folded, S)
    # count == 0 rows went through an fp32 round trip only, which is exact for fp32/bf16/fp16 pools.
    temporal[:, dst] = S.to(temporal.dtype)

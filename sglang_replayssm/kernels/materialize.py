"""Public entry point for ReplaySSM *materialize*: make a slot's checkpoint exact by folding its ring.

``materialize`` dispatches to the Triton kernel for CUDA tensors and to the torch reference
otherwise. Contract (all layers in one call; tensors are the ``MambaPool`` tensors with their
leading layer dimension): for each row ``i``,

    ``temporal[:, dst[i]] = fold(temporal[:, src[i]], records 0..counts[i]-1 of slot src[i])``

where folding a record is ``S <- S . Diag(exp g_j) + d_j k_j^T`` (GDN: scalar ``g_j`` per value
head; KDA: per K channel). Rows with ``src < 0`` or ``dst < 0`` are skipped; ``count == 0`` is an
exact copy; ``dst == src`` folds in place; source rings and (other than in place) source
checkpoints are not written; the cursor (``write_pos``) is not touched, the caller resets it.
Shapes and invariants: :func:`sglang_replayssm.kernels.materialize_ref.check_materialize_args`.
"""

from __future__ import annotations

import torch

from sglang_replayssm.kernels.materialize_ref import check_materialize_args, materialize_torch

__all__ = ["check_materialize_args", "materialize"]


def materialize(
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
) -> None:
    """Fold ``counts[i]`` ring records of ``src_slots[i]`` into ``temporal[:, dst_slots[i]]``, in place.

    Args:
        temporal: ``[n_layers, slots, HV, V, K]`` checkpoints (written at the destination slots).
        ring_d: ``[n_layers, slots, HV, L, V]``; ring_k: ``[n_layers, slots, H, L, K]``;
            ring_g: fp32 ``[n_layers, slots, HV, L]`` (GDN) or ``[n_layers, slots, HV, L, K]`` (KDA).
        src_slots, dst_slots, counts: 1-D integer tensors ``[R]`` on the pool's device.
        is_kda: per-channel (KDA) instead of per-head (GDN) decay.
        check_values: validate index values on the host (a device sync on CUDA). Pass False only
            when the caller guarantees the invariants (distinct destinations, no destination that
            another row reads, ``0 <= count <= L``).
        ring_src: the ring row of each row's records (``[R]``) when the ring tensors hold one row per
            running request instead of one per slot (``[n_layers, rows, ...]``); None: ``src_slots``.
    """
    call = check_materialize_args(
        temporal, ring_d, ring_k, ring_g, src_slots, dst_slots, counts, is_kda=is_kda, check_values=check_values,
        ring_src=ring_src,
    )
    if temporal.is_cuda:
        from sglang_replayssm.kernels.materialize_triton import materialize_triton

        materialize_triton(call)
    else:
        materialize_torch(call)

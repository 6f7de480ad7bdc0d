"""Bind sglang-replayssm's ring decode (:func:`sglang_replayssm.kernels.ring_decode.ring_decode`:
Triton, or the CUDA passes of kernels/csrc/ring_read.cu where they build and the inputs fit) where
SGLang 0.5.23's packed-decode methods would launch its own ReplaySSM kernel, on CUDA tensors only.

Same ring layout, cursor and flush semantics (the kernel takes SGLang's exact argument list), so the
swap changes speed, not results; rows without rings, the KDA safe gate (lower_bound) and non-CUDA
tensors go to SGLang's original method unchanged.

With a read copy on the pool (``SGLANG_REPLAYSSM_READ_COPY``, the read copy room's
:class:`~sglang_replayssm.radix.ring.pool.CheckpointCopies`, installed when it attaches) the step is
:func:`sglang_replayssm.kernels.read_copy_cuda.read_copy_decode_cuda`; inputs it does not handle raise
its ``CudaReadUnsupported`` (never a silent fallback to the torch reference), and so does the KDA safe
gate, which SGLang's kernel would run without the copy's records (and so do rings keyed by request row,
whose map SGLang's kernel cannot read). Its stale-row refresh is one Triton
launch with no host sync (:mod:`sglang_replayssm.kernels.read_copy_refresh`): the step is capturable.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from sglang_replayssm.kernels.ring_decode import ring_decode
from sglang_replayssm.radix.ring.pool import checkpoint_copies
from sglang_replayssm.radix.ring.rows import ring_map_of

logger = logging.getLogger(__name__)


@functools.cache
def _warn_unlinked(kind: str) -> None:
    """Once per kind and process: a read copy is installed but a decode kernel reaches none."""
    logger.warning("sglang-replayssm: the read copy is on but a %s decode kernel reaches no copy of its layer "
                   "(kernel not linked to its pool): the fp32 ring decodes it", kind)


_RING_KEYS = ("replayssm_d", "replayssm_k", "replayssm_g", "replayssm_write_pos")


def _has_ring(kwargs: dict[str, Any]) -> bool:
    return all(kwargs.get(key) is not None for key in _RING_KEYS)


def _ours_applies(mixed_qkv: Any, kwargs: dict[str, Any]) -> bool:
    return bool(mixed_qkv.is_cuda and _has_ring(kwargs) and kwargs.get("lower_bound") is None)


def layer_of(kernel: Any, ssm_states: Any) -> Any:
    """The installed checkpoint copy of the pool layer ``ssm_states`` is, reached through the decode
    ``kernel`` SGLang called (its pool, linked when its backend was built), or None."""
    copies = checkpoint_copies()
    return None if copies is None else copies.layer_of(kernel, ssm_states)


def ring_packed_decode(original: Callable[..., Any], kernel: Any, mixed_qkv: Any, a: Any, b: Any, *,
                       is_kda: bool, **kwargs: Any) -> Any:
    """Body of the AROUND hooks on TritonGDNKernel/TritonKDAKernel.packed_decode."""
    states = kwargs.get("ssm_states")
    if kwargs.get("lower_bound") is not None and states is not None and layer_of(kernel, states) is not None:
        raise RuntimeError("sglang-replayssm: SGLANG_REPLAYSSM_READ_COPY does not cover the KDA safe gate "
                           "(lower_bound): run it with SGLANG_REPLAYSSM_READ_COPY=off")
    ring_map = ring_map_of(kernel) if _has_ring(kwargs) else None
    if not _ours_applies(mixed_qkv, kwargs):
        if ring_map is not None and mixed_qkv.is_cuda:  # SGLang's kernel reads the ring by slot
            raise RuntimeError("sglang-replayssm: SGLANG_REPLAYSSM_RING_ROWS does not cover the KDA safe gate "
                               "(lower_bound): run it with SGLANG_REPLAYSSM_RING_ROWS=off")
        return original(kernel, mixed_qkv, a, b, **kwargs)

    ssm_states = kwargs["ssm_states"]
    hv, v_dim, k_dim = kwargs["num_v_heads"], kwargs["head_v_dim"], ssm_states.shape[-1]
    rows = mixed_qkv.shape[0]
    out = mixed_qkv.new_empty(rows, 1, hv, v_dim)
    if is_kda:
        a = a.reshape(rows, hv, k_dim).contiguous()
        dt_bias = kwargs["dt_bias"].reshape(hv, k_dim).contiguous()
    else:
        dt_bias = kwargs["dt_bias"]
    copy = layer_of(kernel, ssm_states)
    if copy is not None:
        from sglang_replayssm.kernels.read_copy_cuda import read_copy_decode_cuda

        copies = checkpoint_copies()
        assert copies is not None  # it found the copy
        copies.decode_step(read_copy_decode_cuda, copy, mixed_qkv, a, b.reshape(rows, hv).contiguous(),
                    kwargs["A_log"].reshape(-1), dt_bias, kwargs["scale"], ssm_states, kwargs["replayssm_k"],
                    kwargs["replayssm_g"], out, kwargs["cache_indices"], kwargs["replayssm_write_pos"],
                    kwargs.get("replayssm_force_flush"), is_kda)  # fmt: skip
        return out.transpose(0, 1)
    if checkpoint_copies() is not None:
        _warn_unlinked("KDA" if is_kda else "GDN")
    ring_decode(
        mixed_qkv, a, b.reshape(rows, hv).contiguous(), kwargs["A_log"].reshape(-1), dt_bias,
        kwargs["scale"], ssm_states, kwargs["replayssm_d"], kwargs["replayssm_k"], kwargs["replayssm_g"],
        out, kwargs["cache_indices"], kwargs["replayssm_write_pos"], kwargs.get("replayssm_force_flush"),
        use_qk_l2norm_in_kernel=True, is_kda=is_kda, ring_map=ring_map,
    )
    return out.transpose(0, 1)

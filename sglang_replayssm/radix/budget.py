"""Charge the ReplaySSM decode ring to SGLang's mamba memory budget.

With ``--enable-linear-replayssm`` every persistent mamba slot (working, ping-pong and radix slots
alike, ``size + 1`` of them) carries a decode ring, allocated by ``MambaPool.__init__`` after the
budget was set. ``KVCacheConfigurator._handle_max_mamba_cache`` prices only ``mamba_cache_per_req``
(conv + temporal) plus ``extra_mamba_cache_bytes_per_req``, so the pool is sized as if the ring were
free and the real footprint overshoots by ``(size + 1) * ring_bytes``.

Fix: while SGLang sizes the pool, ``extra_mamba_cache_bytes_per_req`` also holds the ring bytes per
slot, which SGLang already adds to every slot's price (both the auto-fit solve and the explicit
``--max-mamba-cache-size`` charge), scaled to the rank's pipeline stage.

With rings keyed by request row (``SGLANG_REPLAYSSM_RING_ROWS``, radix/ring/rows.py) the pool holds one
ring per request row, ``max_num_reqs + 1`` of them, and SGLang caps ``max_num_reqs`` at
``max_mamba_cache_size // ratio`` (``KVCacheConfigurator.resolve_max_num_reqs``, ``ratio`` the state
slots it counts per request): so each slot is charged ``ceil(ring / ratio)`` plus its cursor and map
entry, and the one padding row comes out of the memory left for the KV cache. An upper bound, solved
with the slots.

A feature room adds its own share (installed at registration): a per-slot charge beside the ring
(:func:`add_slot_charge`; the read copy, radix/read_copy/startup.py) and a fixed reservation out of the
memory left for the KV cache (:func:`add_reservation`; the record pool, radix/records/budget.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang_replayssm.radix.ring.rows import rows_on
from sglang_replayssm.strategies import STRATEGIES

__all__ = ["add_reservation", "add_slot_charge", "charge_decode_ring", "decode_ring_bytes_per_slot", "ring_row_bytes"]

_FP32_BYTES = 4
_CURSOR_BYTES = 4  # one int32 write_pos per slot
_ROW_MAP_BYTES = 4  # one int32 slot -> ring row entry per slot (rings keyed by request row)
_GIB = float(1 << 30)


def add_slot_charge(name: str, charge: Callable[[Any, Any, int], int]) -> None:
    """Add ``charge``'s bytes to every mamba slot's price beside the decode ring (idempotent per name;
    ``STRATEGIES.slot_charges``)."""
    STRATEGIES.slot_charges[name] = charge


def add_reservation(name: str, reserve: Callable[..., float]) -> None:
    """Reserve ``reserve(configurator, rest_gib, spec_ring=...)`` GiB out of the memory left for the KV
    cache (idempotent per name; ``STRATEGIES.reservations``)."""
    STRATEGIES.reservations[name] = reserve


def _reserved_gib(configurator: Any, rest_gib: float, *, spec_ring: bool) -> float:
    return sum((reserve(configurator, rest_gib, spec_ring=spec_ring) for reserve in STRATEGIES.reservations.values()), 0.0)


def decode_ring_bytes_per_slot(cache_params: Any, record_len: int) -> int:
    """Bytes of the decode ring of one mamba slot over all of its layers, as MambaPool allocates it,
    plus its int32 cursor (:func:`ring_row_bytes` + 4)."""
    return ring_row_bytes(cache_params, record_len) + _CURSOR_BYTES


def ring_row_bytes(cache_params: Any, record_len: int) -> int:
    """Bytes of one decode ring over all layers: per layer ``d [HV, L, V]`` and ``k [H_k, L, K]`` in
    the SSM dtype, ``g`` fp32 ``[HV, L]`` (GDN) or ``[HV, L, K]`` (KDA)."""
    if record_len < 1:
        raise ValueError(f"record_len must be >= 1, got {record_len}")
    hv, v_dim, k_dim = cache_params.shape.temporal
    h_k = getattr(cache_params.shape, "num_k_heads_per_tp", hv)
    ring_b = cache_params.dtype.temporal.itemsize
    g_elems = hv * record_len * (k_dim if cache_params.is_kda else 1)
    per_layer = hv * record_len * v_dim * ring_b + h_k * record_len * k_dim * ring_b + g_elems * _FP32_BYTES
    return per_layer * len(cache_params.layers)


def charge_decode_ring(original: Callable[..., Any], configurator: Any, total_rest_memory: float) -> Any:
    """Run SGLang's mamba sizing with the decode ring added to the per-slot price.

    Invariant: ``configurator.extra_mamba_cache_bytes_per_req`` is restored afterwards (also on
    error), and nothing changes unless the decode ring (not the spec ring) is on. With the spec ring
    (which SGLang prices itself) only the reservations are made that live there (the record pool with
    ``record_spec_ring``); with the decode ring, the rooms' slot charges are added beside the ring.
    """
    from sglang.srt.runtime_context import get_exec

    mamba = get_exec().mamba
    mambaish = getattr(configurator, "mambaish_config", None)
    if mambaish is not None and getattr(mamba, "enable_linear_replayssm_spec", False):
        rest = original(configurator, total_rest_memory)
        return rest - _reserved_gib(configurator, rest, spec_ring=True)
    if mambaish is None or not mamba.enable_linear_replayssm:
        return original(configurator, total_rest_memory)
    params, record_len = mambaish.mamba2_cache_params, mamba.linear_replayssm_cache_len
    padding_row_gib = 0.0
    if rows_on():  # one ring per request row: at most size // ratio + 1 rows
        row = ring_row_bytes(params, record_len)
        ratio = max(1, int(configurator._calculate_mamba_ratio()))
        ring = -(-row // ratio) + _CURSOR_BYTES + _ROW_MAP_BYTES
        padding_row_gib = row / _GIB
    else:
        ring = decode_ring_bytes_per_slot(params, record_len)
    for charge in STRATEGIES.slot_charges.values():
        ring += charge(configurator, mambaish.mamba2_cache_params, mamba.linear_replayssm_cache_len)
    saved = configurator.extra_mamba_cache_bytes_per_req
    configurator.extra_mamba_cache_bytes_per_req = saved + ring
    try:
        rest = original(configurator, total_rest_memory)
    finally:
        configurator.extra_mamba_cache_bytes_per_req = saved
    rest -= padding_row_gib
    return rest - _reserved_gib(configurator, rest, spec_ring=False)



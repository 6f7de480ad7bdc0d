"""Charge the ReplaySSM decode ring to SGLang's mamba memory budget.

With ``--enable-linear-replayssm`` every persistent mamba slot (working, ping-pong and radix slots
alike, ``size + 1`` of them) carries a decode ring, allocated by ``MambaPool.__init__`` after the
budget was set. ``KVCacheConfigurator._handle_max_mamba_cache`` prices only ``mamba_cache_per_req``
(conv + temporal) plus ``extra_mamba_cache_bytes_per_req``, so the pool is sized as if the ring were
free and the real footprint overshoots by ``(size + 1) * ring_bytes``.

Fix: while SGLang sizes the pool, ``extra_mamba_cache_bytes_per_req`` also holds the ring bytes per
slot, which SGLang already adds to every slot's price (both the auto-fit solve and the explicit
``--max-mamba-cache-size`` charge), scaled to the rank's pipeline stage.

The read copy (``SGLANG_REPLAYSSM_READ_COPY=bf16|fp8``, :mod:`read_copy`) is charged the same way,
beside the ring: its bytes per slot are added to ``extra_mamba_cache_bytes_per_req`` too, less its
``d~`` / ``v`` records where they are carved out of SGLang's (already charged) ``replayssm_d``.

Records (``record_hits``, GDN): the record pool (:mod:`records`, ``capacity`` tokens of every GDN
layer's pre-conv row and two gate rows in the serving dtype, plus one interval state per
``interval`` tokens, :mod:`interval_states`) is reserved out of the memory left for the KV cache, as
a fixed amount (:func:`record_bytes`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sglang_replayssm import settings

__all__ = [
    "charge_decode_ring",
    "decode_ring_bytes_per_slot",
    "interval_state_bytes",
    "record_bytes",
    "record_bytes_per_token",
]
logger = logging.getLogger(__name__)

_FP32_BYTES = 4
_CURSOR_BYTES = 4  # one int32 write_pos per slot


def decode_ring_bytes_per_slot(cache_params: Any, record_len: int) -> int:
    """Bytes of the decode ring of one mamba slot over all of its layers, as MambaPool allocates it.

    Per layer: ``d [HV, L, V]`` and ``k [H_k, L, K]`` in the SSM dtype, ``g`` fp32 ``[HV, L]`` (GDN)
    or ``[HV, L, K]`` (KDA); plus one int32 cursor per slot.
    """
    if record_len < 1:
        raise ValueError(f"record_len must be >= 1, got {record_len}")
    hv, v_dim, k_dim = cache_params.shape.temporal
    h_k = getattr(cache_params.shape, "num_k_heads_per_tp", hv)
    ring_b = cache_params.dtype.temporal.itemsize
    g_elems = hv * record_len * (k_dim if cache_params.is_kda else 1)
    per_layer = hv * record_len * v_dim * ring_b + h_k * record_len * k_dim * ring_b + g_elems * _FP32_BYTES
    return per_layer * len(cache_params.layers) + _CURSOR_BYTES


def charge_decode_ring(original: Callable[..., Any], configurator: Any, total_rest_memory: float) -> Any:
    """Run SGLang's mamba sizing with the decode ring added to the per-slot price.

    Invariant: ``configurator.extra_mamba_cache_bytes_per_req`` is restored afterwards (also on
    error), and nothing changes unless the decode ring (not the spec ring) is on. With the spec ring
    (which SGLang prices itself) only the record pool is reserved, when it lives there (``record_spec_ring``).
    """
    from sglang.srt.runtime_context import get_exec

    from sglang_replayssm.radix import config

    mamba = get_exec().mamba
    mambaish = getattr(configurator, "mambaish_config", None)
    if mambaish is not None and getattr(mamba, "enable_linear_replayssm_spec", False):
        rest = original(configurator, total_rest_memory)
        return rest - _record_reservation_gib(configurator, rest) if config.enabled("record_spec_ring") else rest
    if mambaish is None or not mamba.enable_linear_replayssm:
        return original(configurator, total_rest_memory)
    ring = decode_ring_bytes_per_slot(mambaish.mamba2_cache_params, mamba.linear_replayssm_cache_len)
    ring += _read_copy_bytes_per_slot(configurator, mambaish.mamba2_cache_params, mamba.linear_replayssm_cache_len)
    saved = configurator.extra_mamba_cache_bytes_per_req
    configurator.extra_mamba_cache_bytes_per_req = saved + ring
    try:
        rest = original(configurator, total_rest_memory)
    finally:
        configurator.extra_mamba_cache_bytes_per_req = saved
    return rest - _record_reservation_gib(configurator, rest)


def _read_copy_bytes_per_slot(configurator: Any, cache_params: Any, record_len: int) -> int:
    """The read copy's bytes per slot (radix/read_copy.py: copy, scales, d~, v, beta, stale mark; not
    the d~ / v records where they are carved out of SGLang's ``replayssm_d``, fix ``read_copy_d_ring``),
    0 while ``SGLANG_REPLAYSSM_READ_COPY=off``; logged in one line when charged.

    The records' io dtype is the conv pool's (``cache_params.dtype.conv``, what ``attach`` allocates
    them in), else the served dtype."""
    from sglang_replayssm.radix import config
    from sglang_replayssm.radix.read_copy import bytes_per_slot, records_in_d_ring

    mode = config.read_copy_mode()
    if mode == "off":
        return 0
    served = getattr(getattr(configurator, "model_config", None), "dtype", None)
    io_itemsize = getattr(getattr(cache_params.dtype, "conv", None), "itemsize", getattr(served, "itemsize", 4))
    nbytes = bytes_per_slot(cache_params, record_len, mode, io_itemsize)
    hv, v_dim, _ = cache_params.shape.temporal
    records = 2 * hv * record_len * v_dim * io_itemsize * len(cache_params.layers)
    carved = records_in_d_ring(cache_params.dtype.temporal.itemsize, io_itemsize, hv * record_len * v_dim)
    logger.info("sglang-replayssm read copy (%s): %d B (%.3f MiB) per mamba slot charged beside the decode ring; "
                "d~ / v records %.3f MiB per slot %s", mode, nbytes, nbytes / (1 << 20), records / (1 << 20),
                "carved out of SGLang's replayssm_d (not charged)" if carved else "allocated (charged)")  # fmt: skip
    return nbytes


def record_bytes_per_token(cache_params: Any, itemsize: int) -> int:
    """Record bytes of one token over all linear layers: ``conv_dim + 2 * HV`` values per GDN layer
    (``conv_dim + HV * K + HV`` per KDA layer: its gate input is per channel)."""
    hv, _, k_dim = cache_params.shape.temporal
    if cache_params.is_kda:  # KDA's conv window is stored [W - 1, conv_dim]
        return (cache_params.shape.conv[0][1] + hv * k_dim + hv) * itemsize * len(cache_params.layers)
    return (cache_params.shape.conv[0][0] + 2 * hv) * itemsize * len(cache_params.layers)


def interval_state_bytes(cache_params: Any) -> int:
    """Bytes of one interval state: every GDN layer's SSM state in the pool's state dtype."""
    hv, v_dim, k_dim = cache_params.shape.temporal
    return hv * v_dim * k_dim * cache_params.dtype.temporal.itemsize * len(cache_params.layers)


def record_bytes(cache_params: Any, itemsize: int, capacity: int, interval: int = 0) -> int:
    """Bytes of a record pool of ``capacity`` tokens (one sink row more) and, with ``interval``, its
    ``capacity // interval + 2`` interval states (one sink more)."""
    states = (capacity // interval + 3) * interval_state_bytes(cache_params) if interval > 0 else 0
    return record_bytes_per_token(cache_params, itemsize) * (capacity + 1) + states


#: The default record pool takes at most this share of the memory left for the KV cache.
DEFAULT_RECORD_SHARE = 0.5


def _record_reservation_gib(configurator: Any, rest_gib: float) -> float:
    """Reserve the record pool out of ``rest_gib`` and fix its capacity for this process.

    An explicit ``SGLANG_REPLAYSSM_RECORD_TOKENS`` that leaves no memory for the KV cache is refused in
    one line; the default shrinks to :data:`DEFAULT_RECORD_SHARE` of ``rest_gib`` (records off below
    one chunk of 64 tokens), logged either way.
    """
    from sglang_replayssm.radix import config
    from sglang_replayssm.radix.interval_states import interval_from_env
    from sglang_replayssm.radix.record_rebuild import sequential_tokens_from_env
    from sglang_replayssm.radix.records import CAPACITY_ENV, capacity_from_env, set_budgeted_capacity

    linear = getattr(configurator, "hybrid_gdn_config", None) or getattr(configurator, "hybrid_kda_config", None)
    if not config.enabled("record_hits") or linear is None:
        return 0.0
    dtype = getattr(getattr(configurator, "model_config", None), "dtype", None)
    itemsize = getattr(dtype, "itemsize", 4)
    params = configurator.mambaish_config.mamba2_cache_params
    # Interval states are kept only from an exact (state-dtype) h: GDN serving in the state dtype.
    exact_h = not params.is_kda and itemsize == params.dtype.temporal.itemsize
    interval = interval_from_env() if exact_h else 0
    sequential_tokens_from_env()  # a bad value is refused here, at startup, not at the first rebuild
    per_token = record_bytes_per_token(params, itemsize)
    if interval > 0:
        per_token += -(-interval_state_bytes(params) // interval)
    explicit = settings.RECORD_TOKENS.is_set()
    capacity = capacity_from_env()
    if not explicit:
        capacity = min(capacity, int(DEFAULT_RECORD_SHARE * rest_gib * (1 << 30)) // per_token - 1)
        capacity = capacity if capacity >= 64 else 0
    nbytes = record_bytes(params, itemsize, capacity, interval) if capacity > 0 else 0
    if explicit and capacity > 0 and nbytes >= rest_gib * (1 << 30):
        raise ValueError(
            f"{CAPACITY_ENV}={capacity}: the record pool needs {nbytes / (1 << 30):.2f} GiB but only "
            f"{rest_gib:.2f} GiB are left for the KV cache; lower it (0 turns records off)"
        )
    set_budgeted_capacity(capacity)
    logger.info("sglang-replayssm records: %d tokens x %d B = %.1f MiB reserved from the KV budget%s",
                capacity, per_token, nbytes / (1 << 20), "" if explicit else " (default)")
    return nbytes / (1 << 30)

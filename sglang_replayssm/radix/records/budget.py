"""The record pool's share of the memory budget (``record_hits``, GDN).

The record pool (:mod:`pool`, ``capacity`` tokens of every GDN layer's pre-conv row and two gate rows
in the serving dtype, plus one interval state per ``interval`` tokens, :mod:`interval_states`) is
reserved out of the memory left for the KV cache, as a fixed amount (:func:`record_bytes`), through
the core budget's reservation (:func:`sglang_replayssm.radix.budget.add_reservation`, installed by
:func:`sglang_replayssm.radix.records.hooks.install`).
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_replayssm import settings
from sglang_replayssm.state import peek, state_of

__all__ = ["default_capacity", "interval_state_bytes", "record_bytes", "record_bytes_per_token", "reservation_gib",
           "reserved_capacity"]
logger = logging.getLogger(__name__)


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
#: Below one chunk of tokens the default pool is not worth keeping: records off.
MIN_DEFAULT_CAPACITY = 64


def default_capacity(capacity: int, rest_bytes: float, per_token: int) -> int:
    """The default record capacity: ``capacity`` tokens, or :data:`DEFAULT_RECORD_SHARE` of the
    ``rest_bytes`` left for the KV cache if less (``per_token`` includes the interval states' share),
    and 0 below :data:`MIN_DEFAULT_CAPACITY`."""
    capacity = min(capacity, int(DEFAULT_RECORD_SHARE * rest_bytes) // per_token - 1)
    return capacity if capacity >= MIN_DEFAULT_CAPACITY else 0


def _record_reservation_gib(configurator: Any, rest_gib: float) -> float:
    """Reserve the record pool out of ``rest_gib`` and hand its capacity to the model ``configurator`` sizes
    the pools for (its state's ``record_capacity``), which the record pool is built with (:mod:`startup`).

    An explicit ``SGLANG_REPLAYSSM_RECORD_TOKENS`` that leaves no memory for the KV cache is refused in
    one line; the default shrinks to :data:`DEFAULT_RECORD_SHARE` of ``rest_gib`` (records off below
    one chunk of 64 tokens), logged either way.
    """
    from sglang_replayssm.radix import config
    from sglang_replayssm.radix.records.interval_states import interval_from_env
    from sglang_replayssm.radix.records.pool import CAPACITY_ENV, capacity_from_env
    from sglang_replayssm.radix.records.rebuild import sequential_tokens_from_env

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
        capacity = default_capacity(capacity, rest_gib * (1 << 30), per_token)
    nbytes = record_bytes(params, itemsize, capacity, interval) if capacity > 0 else 0
    if explicit and capacity > 0 and nbytes >= rest_gib * (1 << 30):
        raise ValueError(
            f"{CAPACITY_ENV}={capacity}: the record pool needs {nbytes / (1 << 30):.2f} GiB but only "
            f"{rest_gib:.2f} GiB are left for the KV cache; lower it (0 turns records off)"
        )
    state_of(configurator.model).record_capacity = capacity
    logger.info("sglang-replayssm records: %d tokens x %d B = %.1f MiB reserved from the KV budget%s",
                capacity, per_token, nbytes / (1 << 20), "" if explicit else " (default)")
    return nbytes / (1 << 30)


def reserved_capacity(configurator: Any) -> int | None:
    """The record tokens the reservation fixed for ``configurator``'s model, or None when none ran."""
    state = peek(getattr(configurator, "model", None))
    return None if state is None else state.record_capacity


def reservation_gib(configurator: Any, rest_gib: float, *, spec_ring: bool) -> float:
    """The record pool's reservation (:func:`_record_reservation_gib`); with the spec ring only when the
    records live there (``record_spec_ring``)."""
    from sglang_replayssm.radix import config

    if spec_ring and not config.enabled("record_spec_ring"):
        return 0.0
    return _record_reservation_gib(configurator, rest_gib)

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

__all__ = ["default_capacity", "default_record_policy", "interval_state_bytes", "kept_states", "record_bytes",
           "record_bytes_per_token", "reservation_gib", "reserved_capacity"]
logger = logging.getLogger(__name__)


def record_bytes_per_token(cache_params: Any, itemsize: int) -> int:
    """Record bytes of one token over all linear layers: ``conv_dim + 2 * HV`` values per GDN layer
    (``conv_dim + HV * K + HV`` per KDA layer: its gate input is per channel)."""
    hv, _, k_dim = cache_params.shape.temporal
    if cache_params.is_kda:  # KDA's conv window is stored [W - 1, conv_dim]
        return (cache_params.shape.conv[0][1] + hv * k_dim + hv) * itemsize * len(cache_params.layers)
    return (cache_params.shape.conv[0][0] + 2 * hv) * itemsize * len(cache_params.layers)


def interval_state_bytes(cache_params: Any, itemsize: int | None = None) -> int:
    """Bytes of one interval state: every GDN layer's SSM state in the pool's state dtype, or in ``itemsize``
    bytes a value (a rounded state is kept in the activation dtype, :mod:`interval_states`)."""
    hv, v_dim, k_dim = cache_params.shape.temporal
    size = cache_params.dtype.temporal.itemsize if itemsize is None else itemsize
    return hv * v_dim * k_dim * size * len(cache_params.layers)


def kept_states(capacity: int, interval: int) -> int:
    """Interval state rows a record pool of ``capacity`` tokens reserves (``capacity // interval + 2`` states, one
    sink more); none without ``interval``."""
    return capacity // interval + 3 if interval > 0 else 0


def record_bytes(cache_params: Any, itemsize: int, capacity: int, interval: int = 0,
                 state_itemsize: int | None = None) -> int:
    """Bytes of a record pool of ``capacity`` tokens (one sink row more) and, with ``interval``, its
    ``capacity // interval + 2`` interval states (one sink more) of ``state_itemsize`` bytes a value (default:
    the pool's state dtype)."""
    states = kept_states(capacity, interval) * interval_state_bytes(cache_params, state_itemsize)
    return record_bytes_per_token(cache_params, itemsize) * (capacity + 1) + states


#: The default record pool takes at most this share of the memory left for the KV cache.
DEFAULT_RECORD_SHARE = 0.5
#: Below four interval spans (256 tokens each) the default pool is refilled before a branch comes back to it:
#: records off. Measured on ``bench --dataset-name rag-mem`` (36 MiB each): a 350-token pool, bought with 5,814
#: tokens of KV, hit 29.7%; records off 47.2% (SGLang's extra_buffer 31.9%).
MIN_DEFAULT_CAPACITY = 1024


def default_capacity(capacity: int, rest_bytes: float, per_token: int) -> int:
    """The default record capacity: ``capacity`` tokens, or :data:`DEFAULT_RECORD_SHARE` of the
    ``rest_bytes`` left for the KV cache if less (``per_token`` includes the interval states' share),
    and 0 below :data:`MIN_DEFAULT_CAPACITY`."""
    capacity = min(capacity, int(DEFAULT_RECORD_SHARE * rest_bytes) // per_token - 1)
    return capacity if capacity >= MIN_DEFAULT_CAPACITY else 0


#: The large default pool only where one token of records costs at most this many tokens of KV: measured
#: with SGLang's tree at equal HBM (lab/plan/RESULTS.md), 65,536 records beat extra_buffer at Qwen3-Next TP8
#: (6 KV tokens a record token) and TP4 (12); at Qwen3-Next TP1 (24) and Kimi-Linear TP1 (81) no record
#: pool beats extra_buffer (the ring's slot charge), and the small pool still hits more than none.
MAX_KV_TOKENS_PER_RECORD = 16
#: Where records pay, the default pool's capacity (at most :data:`DEFAULT_RECORD_SHARE` of the KV budget):
#: 65,536 tokens hit more than 16,384 and 4,096 there (same measurement).
PAYING_CAPACITY = 65536


def default_record_policy(capacity: int, rest_bytes: float, per_token: int, kv_per_token: int) -> tuple[int, str]:
    """The default record capacity and why, from the bytes of one token of records (``per_token``, the
    interval states' share included) and of KV (``kv_per_token``, one rank; 0: unknown) and ``rest_bytes``
    left for the KV cache: :func:`default_capacity` of ``capacity`` where a token of records costs more
    than :data:`MAX_KV_TOKENS_PER_RECORD` tokens of KV or the KV bytes are unknown, else of at least
    :data:`PAYING_CAPACITY` tokens.
    ``sglang-replayssm plan`` and the startup reservation both apply it."""
    if kv_per_token <= 0:
        tokens = default_capacity(capacity, rest_bytes, per_token)
        return tokens, "default: KV bytes per token unknown" + ("" if tokens else ", too little memory: records off")
    ratio = per_token / kv_per_token
    if ratio > MAX_KV_TOKENS_PER_RECORD:
        tokens = default_capacity(capacity, rest_bytes, per_token)
        return tokens, (f"default: a token of records costs {ratio:.0f} tokens of KV (> {MAX_KV_TOKENS_PER_RECORD}): "
                        f"the small pool, which hits more than none at equal memory" + (
                            "" if tokens else f", < {MIN_DEFAULT_CAPACITY} tokens fit: records off"))
    tokens = default_capacity(max(capacity, PAYING_CAPACITY), rest_bytes, per_token)
    return tokens, f"default: a token of records costs {ratio:.0f} tokens of KV" + (
        "" if tokens else f", < {MIN_DEFAULT_CAPACITY} tokens fit: records off")


def _kv_bytes_per_token(configurator: Any) -> int:
    """One token's KV cache bytes on this rank, as SGLang's pool configurator sizes a cell (0 if it cannot
    say: the policy then does not turn records off)."""
    try:
        from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator

        return int(DefaultPoolConfigurator(configurator)._cell_size)
    except Exception:  # noqa: BLE001 - a configurator SGLang's default pool cannot size: no verdict
        return 0


def _record_reservation_gib(configurator: Any, rest_gib: float) -> float:
    """Reserve the record pool out of ``rest_gib`` and hand its capacity to the model ``configurator`` sizes
    the pools for (its state's ``record_capacity``), which the record pool is built with (:mod:`startup`).

    An explicit ``SGLANG_REPLAYSSM_RECORD_TOKENS`` that leaves no memory for the KV cache is refused in
    one line; the default is :func:`default_record_policy`'s (records off where they do not pay at equal
    memory, else at most :data:`DEFAULT_RECORD_SHARE` of ``rest_gib``), logged either way with its reason.
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
    # The policy prices interval states where h is exact (GDN serving in the state dtype), as it was measured;
    # the reservation holds every state kept (allocated at the first prefill): exact, or rounded once to the
    # serving dtype (STATE_INTERVAL_ROUNDED), GDN's and KDA's.
    same_dtype = itemsize == params.dtype.temporal.itemsize
    exact_h = not params.is_kda and same_dtype
    kept = interval_from_env() if same_dtype or settings.STATE_INTERVAL_ROUNDED.value() else 0
    interval = kept if exact_h else 0
    sequential_tokens_from_env()  # a bad value is refused here, at startup, not at the first rebuild
    per_token = record_bytes_per_token(params, itemsize)
    if interval > 0:
        per_token += -(-interval_state_bytes(params) // interval)
    explicit = settings.RECORD_TOKENS.is_set()
    capacity = capacity_from_env()
    reason = "set"
    if not explicit:
        capacity, reason = default_record_policy(capacity, rest_gib * (1 << 30), per_token,
                                                 _kv_bytes_per_token(configurator))
    # kept states are in h's dtype: the activation dtype for GDN and KDA (SGLang's chunk kernels allocate h like k,
    # sglang/kernels/ops/attention/fla/chunk_delta_h.py:397), exact where it is the state dtype, else rounded
    nbytes = record_bytes(params, itemsize, capacity, kept, state_itemsize=itemsize) if capacity > 0 else 0
    if explicit and capacity > 0 and nbytes >= rest_gib * (1 << 30):
        raise ValueError(
            f"{CAPACITY_ENV}={capacity}: the record pool needs {nbytes / (1 << 30):.2f} GiB but only "
            f"{rest_gib:.2f} GiB are left for the KV cache; lower it (0 turns records off)"
        )
    state_of(configurator.model).record_capacity = capacity
    logger.info("sglang-replayssm records: %d tokens x %d B + %d kept states x %d B = %.1f MiB reserved from the KV "
                "budget (%s)", capacity, record_bytes_per_token(params, itemsize), kept_states(capacity, kept) if capacity else 0,
                interval_state_bytes(params, itemsize), nbytes / (1 << 20), reason)
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

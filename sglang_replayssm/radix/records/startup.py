"""The record pool, built once with SGLang's memory pools (after ``KVCacheConfigurator.configure``).

``configure`` sizes the pools (the KV-budget reservation of :mod:`budget` runs inside it and leaves the
capacity it reserved on the configurator's model, :func:`~sglang_replayssm.radix.records.budget.reserved_capacity`)
and builds them: when it returns,
the ``HybridReqToTokenPool``, the token KV pool and its allocator all exist, and :func:`build_pool`
attaches a :class:`~sglang_replayssm.radix.records.pool.RecordPool` to the ``HybridReqToTokenPool``
(:func:`~sglang_replayssm.radix.records.pool.attach`), or turns records off for it for good.

A pool is built only beside a ReplaySSM ring the forwards capture for
(:func:`~sglang_replayssm.radix.records.capture.ring_captured`); a draft worker's configurator builds
none (it shares the target's ``HybridReqToTokenPool``), nor does a second ``configure`` of a pool that
already has one.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from sglang_replayssm import settings
from sglang_replayssm.radix.records.budget import reserved_capacity
from sglang_replayssm.radix.records.capture import ring_captured
from sglang_replayssm.radix.records.interval_states import INTERVAL_ENV, IntervalStates, interval_from_env
from sglang_replayssm.radix.records.pool import CAPACITY_ENV, RecordPool, attach, capacity_from_env, detach
from sglang_replayssm.radix.records.rebuild import sequential_tokens_from_env
from sglang_replayssm.state import peek

__all__ = ["build_pool", "prepare_layers"]

logger = logging.getLogger(__name__)


def build_pool(configurator: Any, pools: Any) -> RecordPool | None:
    """After ``configurator.configure`` returned ``pools`` (its ``KVCacheConfigResult``): attach the
    record pool to ``pools.req_to_token_pool`` and return it; None where records are off.

    Capacity: :func:`~sglang_replayssm.radix.records.pool.capacity_from_env` with what the reservation
    fixed for ``configurator``'s model, at most one record per KV row (``size + page_size + 1`` rows); a capacity
    of 0 or no token KV pool turns records off for this pool."""
    if getattr(configurator, "is_draft_worker", False):
        return None
    req_pool = getattr(pools, "req_to_token_pool", None)
    state = peek(req_pool)
    if state is not None and (state.record_pool is not None or state.records_off):
        return state.record_pool
    if req_pool is None or not ring_captured(req_pool):
        return None
    kv_pool = getattr(pools, "token_to_kv_pool", None)
    if kv_pool is None or not hasattr(kv_pool, "size"):
        detach(req_pool)
        return None
    kv_size = int(kv_pool.size) + int(getattr(kv_pool, "page_size", 1)) + 1  # KV rows: size + page
    capacity = capacity_from_env(kv_size, reserved_capacity(configurator))
    if capacity <= 0:
        detach(req_pool)
        return None
    device: torch.device = req_pool.req_to_token.device
    pool = RecordPool(kv_size=kv_size, capacity=capacity, device=device)
    pool.capture_decode = device.type == "cpu"
    # The CPU runtime's decode kernel takes one token per sequence: CPU rebuilds stay on the chunk path.
    pool.sequential_tokens = sequential_tokens_from_env() if device.type == "cuda" else 0
    interval = interval_from_env()
    if interval > 0:
        pool.states = IntervalStates(kv_size=kv_size, capacity=capacity // interval + 2, interval=interval,
                                     device=device, rounded=settings.STATE_INTERVAL_ROUNDED.value())
    prepare_layers(pool, req_pool)
    _warn_full_prefill_graphs()
    logger.info("sglang-replayssm records: %d tokens of layer inputs (first in, first out; %s=N to change), "
                "a prefill state every %s (%s=N, 0 = none)", capacity, CAPACITY_ENV,
                f"{interval} tokens" if interval else "- (off)", INTERVAL_ENV)
    return attach(req_pool, pool)


def _warn_full_prefill_graphs() -> bool:
    """One warning where SGLang's prefill CUDA graphs are the full kind: a full graph replays every linear layer
    inside the graph, so the prefills it runs keep no records (``capture.drop_graph_replayed``); returns whether it
    warned. Breakable graphs (SGLang's default on CUDA) break at each linear layer and keep them."""
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend

    if not check_cuda_graph_backend(Phase.PREFILL, Backend.FULL):
        return False
    logger.warning("sglang-replayssm records: full prefill CUDA graphs replay every linear layer inside the graph, "
                   "so the prefills they run keep no records (their hits resume from SGLang's own states only); "
                   "breakable prefill graphs (SGLang's default) keep them")
    return True


def prepare_layers(pool: RecordPool, req_pool: Any) -> None:
    """Tell ``pool`` (and its interval states) the mamba pool's linear layers, in the pool's order
    (``req_pool.mamba_map``: layer id -> index): their gate inputs and kept states are then rows of one
    stack each, so a rebuild gathers and copies them for every layer at once. A pool without that map
    keeps one tensor per layer."""
    mamba_map = getattr(req_pool, "mamba_map", None)
    if not isinstance(mamba_map, dict) or sorted(mamba_map.values()) != list(range(len(mamba_map))):
        return
    layer_ids = tuple(sorted(mamba_map, key=mamba_map.__getitem__))
    pool.layer_ids = layer_ids
    if pool.states is not None:
        pool.states.layer_ids = layer_ids

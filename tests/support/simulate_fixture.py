"""SGLang's real cache objects for the simulation, built on CPU (for :mod:`simulate`).

:func:`build_fixture` runs SGLang's own unit-test kit
(``sglang.test.kits.unified_radix_cache.fixtures.build_fixture``) with its constructors swapped
for a GDN/KDA decode-ring pool; the backend and result-processor classes carry only what the
simulated steps read. Test-only: patches SGLang's kit with ``unittest.mock`` for one build.
"""

from __future__ import annotations

import functools
import os
from contextlib import ExitStack
from typing import Any
from unittest import mock

import torch

from sglang_replayssm.settings import RING_ROWS
from tests.support.simulate_model import SimConfig, ToyModel

__all__ = [
    "backend_cls",
    "build_fixture",
    "cache_params",
    "result_processor_cls",
    "torch_track_all_layers",
    "torch_track_copy",
]


def torch_track_all_layers(
    conv_states: torch.Tensor,
    ssm_states: torch.Tensor,
    cache_indices: torch.Tensor,
    mamba_track_mask: torch.Tensor,
    mamba_track_indices: torch.Tensor,
    batch_size: int,
    check_freed_slots: bool = False,
) -> None:
    """Torch stand-in for SGLang's ``track_mamba_states_all_layers`` / ``_if_needed`` (slot dim 1
    for all-layer pools, 0 for one layer's tensors, told apart by ``ssm_states.dim()``)."""
    rows = torch.nonzero(mamba_track_mask[:batch_size]).flatten()
    src = cache_indices[rows].long()
    dst = mamba_track_indices[rows].long()
    if check_freed_slots:
        ok = (src >= 0) & (dst >= 0)
        src, dst = src[ok], dst[ok]
    if ssm_states.dim() == 5:
        conv_states[:, dst] = conv_states[:, src]
        ssm_states[:, dst] = ssm_states[:, src]
    else:
        conv_states[dst] = conv_states[src]
        ssm_states[dst] = ssm_states[src]


def cache_params(cfg: SimConfig, model: ToyModel, layer_ids: list[int]) -> Any:
    """SGLang's cache params (GDN: Mamba2, KDA: Kimi-Linear) of the toy model: fp32 states, the conv
    pool in ``cfg.io_dtype``."""
    from sglang.srt.configs.mamba_utils import (
        KimiLinearCacheParams,
        KimiLinearStateShape,
        Mamba2CacheParams,
        Mamba2StateDType,
        Mamba2StateShape,
    )

    dtype = Mamba2StateDType(conv=cfg.io_dtype, temporal=torch.float32)
    if cfg.is_kda:
        shape = KimiLinearStateShape.create(
            tp_world_size=1, num_heads=model.HV, head_dim=model.V, num_k_heads=model.H, head_k_dim=model.K,
            conv_kernel_size=cfg.conv_kernel,
        )
        return KimiLinearCacheParams(shape=shape, layers=layer_ids, dtype=dtype)
    shape = Mamba2StateShape.create(
        tp_world_size=1, intermediate_size=model.HV * model.V, n_groups=model.H, num_heads=model.HV,
        head_dim=model.V, state_size=model.K, conv_kernel=cfg.conv_kernel,
    )
    return Mamba2CacheParams(shape=shape, layers=layer_ids, dtype=dtype)


def build_fixture(cfg: SimConfig, model: ToyModel) -> tuple[Any, Any, Any]:
    """SGLang's ``build_fixture`` on CPU with a GDN/KDA decode-ring pool: ``(cache, allocator, pool)``.

    The kit builds a Mamba2 pool without ReplaySSM; its constructors are wrapped so the same build
    gets this config's cache params, ``enable_linear_replayssm`` and the strategy's server args (and,
    with ``cfg.ring_rows``, decode rings keyed by request row).
    """
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.srt.server_args import ServerArgs
    from sglang.test.kits.unified_radix_cache import fixtures
    from sglang.test.kits.unified_radix_cache.config import CacheConfig

    layer_ids = list(range(cfg.mamba_layers))
    params = cache_params(cfg, model, layer_ids)
    overlap = cfg.extra_buffer if cfg.overlap is None else cfg.overlap

    def server_args(**kw: Any) -> Any:
        return ServerArgs(
            **kw,
            mamba_radix_cache_strategy=cfg.strategy,
            mamba_track_interval=cfg.track_interval,
            enable_linear_replayssm=True,
            linear_replayssm_cache_len=cfg.ring_len,
            disable_overlap_schedule=not overlap,
        )

    pool_cls = functools.partial(
        HybridReqToTokenPool,
        enable_linear_replayssm=True,
        linear_replayssm_cache_len=cfg.ring_len,
        enable_mamba_extra_buffer_lazy=cfg.lazy,
        enable_overlap_schedule=overlap,
    )
    kit_cfg = CacheConfig(
        page_size=1,
        components=(ComponentType.FULL, ComponentType.MAMBA),
        num_layers=cfg.mamba_layers + 1,
        full_attention_layer_ids=(cfg.mamba_layers,),
        enable_mamba_extra_buffer=cfg.extra_buffer,
        mamba_cache_size=cfg.mamba_slots,
        kv_size=cfg.kv_size,
        max_num_reqs=cfg.max_reqs,
        max_context_len=cfg.max_context_len,
        head_num=1,
        head_dim=8,
        dtype=torch.float32,
    )
    with (
        mock.patch.dict(os.environ, {RING_ROWS.name: "on" if cfg.ring_rows else "off"}),  # read at the build only
        mock.patch.object(fixtures, "get_device", lambda: "cpu"),
        mock.patch.object(fixtures, "ServerArgs", server_args),
        mock.patch.object(fixtures, "Mamba2CacheParams", lambda shape, layers: params),
        mock.patch.object(fixtures, "HybridReqToTokenPool", pool_cls),
    ):
        return fixtures.build_fixture(kit_cfg, mamba_cache_chunk_size=cfg.chunk)


def backend_cls() -> type:
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import MambaAttnBackendBase

    class _Backend(MambaAttnBackendBase):
        """SGLang's mamba backend base with only what decode metadata and the track snapshot read
        (its ``__init__`` needs a ModelRunner)."""

        def __init__(self, req_to_token_pool: Any):  # noqa: D401 - deliberately no super().__init__
            self.device = "cpu"
            self.req_to_token_pool = req_to_token_pool
            self.enable_unified_memory = False
            self.forward_metadata = None
            self.topk = 0
            self.pad_slot_id = -1
            self._fused_state_indices_ok = False
            self.replayssm_write_pos_list = None
            self.replayssm_force_flush_list = None

    return _Backend


def result_processor_cls() -> type:
    from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor

    methods = {
        name: SchedulerBatchResultProcessor.__dict__[name]
        for name in (
            "_mamba_prefix_cache_update",
            "_mamba_check_track_boundary",
            "_mamba_assert_committed_len_lookahead",
            "mamba_lazy_post_decode_at_boundary",
        )
    }

    def __init__(self: Any, tree_cache: Any) -> None:
        self.tree_cache = tree_cache

    return type("_ResultProcessor", (), {"__init__": __init__, **methods})


def torch_track_copy(active: bool) -> ExitStack:
    """Context in which SGLang's decode track copies rows with torch instead of its Triton kernel
    (when ``active``); same semantics: for each row with ``mask``, ``conv[:, dst] = conv[:, src]``
    and ``temporal[:, dst] = temporal[:, src]``."""
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as hlab

    stack = ExitStack()
    if active:
        stack.enter_context(mock.patch.object(hlab, "track_mamba_states_all_layers", torch_track_all_layers))
        stack.enter_context(mock.patch.object(hlab, "track_mamba_states_if_needed", torch_track_all_layers))
    return stack

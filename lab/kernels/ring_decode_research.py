"""The ring decode with research-only knobs: the sweeps' and GPU tests' entry.

:class:`ResearchKnobs` holds the launch parameters the product never sets (each at the value the
product launches with): other flush folds, an L2 hint, a register cap, slice-pass tile orders and
pipelining, the CUDA read pass paired with the Triton flush pass, bulk-copy builds, warps per
(row, head) and the read pass's grid cap. :func:`ring_decode_research` runs a step like
:func:`sglang_replayssm.kernels.ring_decode.ring_decode`, reading them; :func:`split_tuning` turns a sweep's flat dict
(production fields and research knobs mixed) into the two objects.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import torch

from sglang_replayssm.kernels.ring_decode import checked_step, cuda_unfit, launch, pick_config
from sglang_replayssm.kernels.ring_decode_args import RingStep
from sglang_replayssm.kernels.ring_decode_config import RingDecodeConfig
from sglang_replayssm.kernels.ring_decode_cuda import VSPLITS, CudaReadUnsupported, run_passes
from sglang_replayssm.kernels.ring_decode_slices import launch_read
from sglang_replayssm.kernels.ring_decode_triton import (
    ALL_ROWS,
    FLUSH_MODES,
    FLUSH_ROWS,
    NON_FLUSH_ROWS,
    launch_rows,
)

__all__ = ["ResearchKnobs", "ring_decode_research", "split_tuning"]

_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(RingDecodeConfig))


@dataclasses.dataclass(frozen=True)
class ResearchKnobs:
    """Launch parameters only the sweeps set (defaults: what the product launches).

    ``flush_mode``: the Triton flush fold (:data:`sglang_replayssm.kernels.ring_decode_triton.FLUSH_MODES`);
    ``evict_first``: L2 evict-first hint on the checkpoint stream; ``maxnreg``: register cap of
    the Triton launches; ``num_stages``: software-pipeline depth (``"regs"`` launches, and the
    ``"slices"`` read pass, where > 1 streams through shared memory); ``slices_first`` /
    ``perm_rows``: the slice pass's tile order; ``cuda_flush``: False pairs the CUDA read pass
    with the Triton flush pass; ``cuda_bulk`` / ``cuda_flush_bulk``: a staged chunk by one sm_90
    bulk copy (a build option); ``cuda_vsplit``: warps per (row, head); ``cuda_waves``: the read
    pass's grid cap in resident sets of blocks.
    """

    flush_mode: str = "fma"
    evict_first: bool = False
    maxnreg: int | None = None
    num_stages: int | None = None
    slices_first: bool = False
    perm_rows: bool = False
    cuda_flush: bool = True
    cuda_bulk: bool = False
    cuda_flush_bulk: bool = False
    cuda_vsplit: int = 1
    cuda_waves: int = 0

    def __post_init__(self) -> None:
        if self.flush_mode not in FLUSH_MODES:
            raise ValueError(f"flush_mode must be one of {sorted(FLUSH_MODES)}")
        if self.cuda_vsplit not in VSPLITS:
            raise ValueError(f"vsplit must be one of {VSPLITS} (got {self.cuda_vsplit})")
        if self.cuda_waves < 0:
            raise ValueError(f"waves must be >= 0 (got {self.cuda_waves})")

    def is_production(self) -> bool:
        return self == ResearchKnobs()


_KNOB_FIELDS = frozenset(f.name for f in dataclasses.fields(ResearchKnobs))


def split_tuning(tuning: Mapping[str, object], base: RingDecodeConfig) -> tuple[RingDecodeConfig, ResearchKnobs]:
    """A sweep's flat launch dict as ``(config, knobs)``: config fields override ``base``, research
    fields go to :class:`ResearchKnobs`; an unknown name is a ``ValueError``."""
    unknown = set(tuning) - _CONFIG_FIELDS - _KNOB_FIELDS
    if unknown:
        raise ValueError(f"unknown launch knob(s) {sorted(unknown)}")
    # a sweep dict's values are untyped (JSON); the frozen dataclasses check what they need
    cfg = dataclasses.replace(base, **{k: v for k, v in tuning.items() if k in _CONFIG_FIELDS})  # type: ignore[arg-type]
    knobs = ResearchKnobs(**{k: v for k, v in tuning.items() if k in _KNOB_FIELDS})  # type: ignore[arg-type]
    return cfg, knobs


def _launch_research(step: RingStep, cfg: RingDecodeConfig, knobs: ResearchKnobs) -> None:
    regs = functools.partial(
        launch_rows, step, cfg, flush_mode=knobs.flush_mode, evict_first=knobs.evict_first, maxnreg=knobs.maxnreg
    )
    if cfg.engine == "cuda":
        run_passes(step, cfg, flush=knobs.cuda_flush, bulk=knobs.cuda_bulk, flush_bulk=knobs.cuda_flush_bulk,
                   vsplit=knobs.cuda_vsplit, waves=knobs.cuda_waves)  # fmt: skip
        if not knobs.cuda_flush:
            regs(FLUSH_ROWS)  # the flush pass of a "cuda" or "slices" step runs one stage
    elif cfg.engine == "slices":
        launch_read(step, cfg, slices_first=knobs.slices_first, perm_rows=knobs.perm_rows,
                    num_stages=knobs.num_stages or 1)  # fmt: skip
        regs(FLUSH_ROWS)
    else:
        for rows in (NON_FLUSH_ROWS, FLUSH_ROWS) if cfg.split else (ALL_ROWS,):
            regs(rows, num_stages=knobs.num_stages or 1)


def ring_decode_research(
    mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
    scale: float, initial_state: torch.Tensor, d_cache: torch.Tensor, k_cache: torch.Tensor,
    g_cache: torch.Tensor, out: torch.Tensor, ssm_state_indices: torch.Tensor, write_pos: torch.Tensor,
    force_flush: torch.Tensor | None = None, use_qk_l2norm_in_kernel: bool = False, is_kda: bool = False, *,
    tuning: Mapping[str, object] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """:func:`sglang_replayssm.kernels.ring_decode.ring_decode` with a sweep's flat launch dict: ``tuning``'s config
    fields override :func:`sglang_replayssm.kernels.ring_decode.pick_config`'s choice for this step (an ``engine`` of
    ``"cuda"`` is then forced: inputs that do not fit raise
    :class:`sglang_replayssm.kernels.ring_decode_cuda.CudaReadUnsupported`), its research fields set
    :class:`ResearchKnobs`. Same effects and return value as the product entry."""
    step = checked_step(
        mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, d_cache, k_cache, g_cache, out,
        ssm_state_indices, write_pos, force_flush, use_qk_l2norm_in_kernel, is_kda,
    )  # fmt: skip
    if step.shape.B == 0:
        return out, initial_state
    tuning = tuning or {}
    forced = tuning.get("engine") == "cuda"
    why = cuda_unfit(step, forced=forced) if tuning.get("engine") in (None, "cuda") else "not requested"
    if forced and why is not None:
        raise CudaReadUnsupported(f"engine='cuda': {why}")
    cfg, knobs = split_tuning(tuning, pick_config(*step.shape, is_kda=is_kda, cuda=why is None))
    if knobs.is_production():
        launch(step, cfg)
    else:
        _launch_research(step, cfg, knobs)
    return out, initial_state

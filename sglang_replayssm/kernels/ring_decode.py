"""Output-only ReplaySSM ring decode for GDN and KDA: the public entry :func:`ring_decode` and
its launch policy :func:`pick_config`.

:func:`ring_decode` takes the arguments SGLang 0.5.23's packed decode passes to
``fused_recurrent_linear_replayssm_decode`` (``sglang/kernels/ops/attention/linear/
fused_recurrent_linear_replayssm.py``) and computes the same function: same ring layout, same
per-row cursor, same flush rule, same in-place checkpoint update. It is written from the math, not
from SGLang's source. SGLang's launch-tuning arguments (``block_v``, ``num_warps``,
``num_stages``, ``nk``) are replaced by one optional frozen :class:`RingDecodeConfig`.

Ring layout (one persistent slot, one layer; ``L`` = ring length)::

    initial_state [slots, HV, V, K]   checkpoint S0 (K contiguous); rewritten only on a flush
    d_cache       [slots, HV, L, V]   corrected deltas d_j
    k_cache       [slots, H,  L, K]   L2-normalised keys k_j (one per key head)
    g_cache       [slots, HV, L] fp32 (GDN, one log-decay per head) or [slots, HV, L, K] (KDA)

Cursor and flush (per decode row ``n`` with ``slot = ssm_state_indices[n]``, ``m = write_pos[n]``):

* records ``0..m-1`` are live; the state before this token is
  ``S = S0 . Diag(A) + sum_{j<m} d_j (W_j o k_j)^T`` with ``A = exp(sum_j g_j)`` and
  ``W_j = exp(sum_{i>j} g_i)`` (scalars for GDN, K vectors for KDA);
* the step is a *flush* when ``m == L-1`` or ``force_flush[n] != 0``. A flush writes
  ``S . Diag(alpha) + d_cur k^T`` into ``initial_state[slot]`` and leaves the ring alone; the
  caller then sets the cursor to 0 (see :mod:`sglang_replayssm.kernels.cursor`);
* otherwise the step appends its record ``(d_cur, k, g)`` at ring position ``m`` (``m < L``) and
  the caller sets the cursor to ``m + 1``;
* rows with ``slot < 0`` are padding: their output is zero and nothing else is touched.

What differs from SGLang's kernel (the function computed is the same):

* *Output-only form.* On a non-flush step the state is never rebuilt. With ``alpha = exp(g_cur)``
  the read-out is ``S (alpha o q) = S0 (A o alpha o q) + sum_j d_j ((W_j o k_j) . (alpha o q))``:
  one streamed pass over ``S0`` (two fused mat-vecs, for ``q`` and ``k``), ``L`` dot products of
  length K per program and one ``[V, L]`` mat-vec over the delta ring. SGLang rebuilds
  ``S0 + D K^T`` tile by tile with a rank-``L`` tensor-core product every step.
* *Streaming.* A program owns one (row, value head) and ``V / v_split`` rows of it, streamed in
  chunks of ``block_v`` rows with 1-2 chunks requested ahead; the first chunks are requested
  before the per-program setup (norms, gates, key ring) so that its latency overlaps the stream.
  With ``split`` the flush path lives in a second launch, so the every-step kernel is small.
* *Exact fp32.* No bf16/TF32 rounding anywhere: the ring stores ``k`` in the ring's dtype (SGLang
  first rounds it to the output dtype) and the flush's rank-``m`` fold runs in IEEE fp32.

Backends (each takes a :class:`~.ring_decode_args.RingStep` and the config): ``"regs"``
:mod:`.ring_decode_triton`; ``"slices"`` :mod:`.ring_decode_slices` plus the Triton flush pass;
``"cuda"`` :mod:`.ring_decode_cuda` (``csrc/ring_read.cu``). Arguments are checked once per step
(:mod:`.ring_decode_args`); ``SGLANG_REPLAYSSM_CUDA_KERNELS=0`` keeps the default off the CUDA
passes.
"""

from __future__ import annotations

import functools
import logging

import torch

from . import ring_decode_cuda
from .ring_decode_args import RingStep, check_fused_layout, check_ring_decode_args, prepare_step
from .ring_decode_config import RingDecodeConfig
from .ring_decode_cuda import (
    DEFAULT_BUILD,
    DEFAULT_FUSED,
    CudaReadUnsupported,
    available,
    run_passes,
    supports,
)
from .ring_decode_slices import launch_read
from .ring_decode_triton import ALL_ROWS, FLUSH_ROWS, NON_FLUSH_ROWS, launch_rows

logger = logging.getLogger(__name__)

__all__ = ["RingDecodeConfig", "checked_step", "cuda_unfit", "launch", "pick_config", "ring_decode"]


@functools.lru_cache(maxsize=1024)
def pick_config(
    B: int, H: int, HV: int, K: int, V: int, L: int, *, is_kda: bool, cuda: bool = False
) -> RingDecodeConfig:
    """Default launch configuration, from the H200 sweeps recorded in notes/kernels.md.

    ``cuda``: the CUDA passes of ``csrc/ring_read.cu`` can run for these inputs; they won at
    B >= 64 for both gate kinds (fewer instructions per byte than any Triton form) and are used
    from B >= 16, with the build :data:`.ring_decode_cuda.DEFAULT_BUILD`, in one launch
    (:data:`.ring_decode_cuda.DEFAULT_FUSED`). Otherwise Triton:
    one-warp programs streaming 8-row chunks (more resident programs per SM beat wider tiles), the
    heads of one row walked consecutively, and for KDA the column-slice read pass (its heavier
    per-program setup leaves fewer instructions for the stream). Below 4096 (row, head) pairs V
    is split across programs so the GPU fills. Small batches keep one Triton launch.
    """
    v_split = 1
    while B * HV * v_split < 4096 and V // (v_split * 2) >= min(V, 16):
        v_split *= 2
    if B >= 16:
        if cuda and K == 128 and V == 128 and L <= 16:
            mb, fmb, st, fst, _, _ = DEFAULT_BUILD
            return RingDecodeConfig(min(V, 8), v_split, 1, 1, True, engine="cuda", cuda_warps=2,
                                    cuda_min_blocks=mb, cuda_flush_min_blocks=fmb, cuda_stages=st,
                                    cuda_flush_stages=fst, cuda_flush_waves=1, cuda_tail=4, cuda_overlap=True,
                                    cuda_fused=DEFAULT_FUSED, row_major=True)  # fmt: skip
        if is_kda and K % 32 == 0:
            return RingDecodeConfig(min(V, 8), v_split, 1, 1, True, engine="slices", slice_k=32,
                                    flush_block_v=min(V, 8), flush_num_warps=1, row_major=True)  # fmt: skip
        return RingDecodeConfig(min(V, 8), v_split, 1, 1, True, row_major=True)
    if is_kda:
        return RingDecodeConfig(min(V, 16), v_split, 4, 1, False)
    return RingDecodeConfig(min(V, 8), v_split, 1, 2, False)


def checked_step(
    mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
    scale: float, initial_state: torch.Tensor, d_cache: torch.Tensor, k_cache: torch.Tensor,
    g_cache: torch.Tensor, out: torch.Tensor, ssm_state_indices: torch.Tensor, write_pos: torch.Tensor,
    force_flush: torch.Tensor | None, use_qk_l2norm_in_kernel: bool, is_kda: bool,
    ring_map: torch.Tensor | None = None,
) -> RingStep:  # fmt: skip
    """The step's one validation (SGLang's checks, then the fused kernels' layout) and its
    :class:`~.ring_decode_args.RingStep`."""
    shape = check_ring_decode_args(
        mixed_qkv, a, b, A_log, dt_bias, initial_state, d_cache, k_cache, g_cache, out, ssm_state_indices,
        write_pos, force_flush, is_kda, ring_map,
    )  # fmt: skip
    check_fused_layout(shape, mixed_qkv, a, b, dt_bias, initial_state, d_cache, k_cache, g_cache, out, is_kda)
    return prepare_step(
        shape, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, d_cache, k_cache, g_cache, out,
        ssm_state_indices, write_pos, force_flush, use_qk_l2norm_in_kernel, is_kda, ring_map,
    )  # fmt: skip


def cuda_unfit(step: RingStep, *, forced: bool) -> str | None:
    """Why the CUDA passes cannot take this step (``None``: they can). Unless ``forced``, a build
    that cannot happen here is a reason too (the default then runs Triton, same results); a forced
    ``engine="cuda"`` lets the build report its own error. A mapped step (rings keyed by request row) takes
    the CUDA passes' row-map build when forced or where :data:`.ring_decode_cuda.MAPPED_DEFAULT` says so."""
    s = step.shape
    if step.ring_map is not None and not forced and not ring_decode_cuda.MAPPED_DEFAULT:
        return "rings keyed by request row (SGLANG_REPLAYSSM_RING_ROWS) take the CUDA passes only when forced"
    why = supports(step.qkv, step.a, step.b, step.A_log, step.dt_bias, step.out, step.state, step.d, step.k,
                   step.g, step.slots, s.K, s.V, s.L)  # fmt: skip
    if why is None and not forced and not available(ring_map=step.ring_map is not None):
        why = "the CUDA passes cannot be built or loaded here"
    return why


_ENGINES_LOGGED: set[tuple[str, str | None]] = set()


def default_config(step: RingStep) -> RingDecodeConfig:
    """:func:`pick_config` for this step, the CUDA passes allowed where they fit and build. Each engine
    (and reason the CUDA passes do not run) is logged once per process."""
    why = cuda_unfit(step, forced=False)
    cfg = pick_config(*step.shape, is_kda=step.is_kda, cuda=why is None)
    key = (cfg.engine, why if cfg.engine != "cuda" else None)
    if key not in _ENGINES_LOGGED:
        _ENGINES_LOGGED.add(key)
        s = step.shape
        logger.info("sglang-replayssm ring decode (%s, B=%d HV=%d K=%d V=%d): %s%s", "KDA" if step.is_kda else "GDN",
                    s.B, s.HV, s.K, s.V, "CUDA passes (csrc/ring_read.cu)" if cfg.engine == "cuda" else
                    f"Triton ({cfg.engine})", "" if why is None else f"; not the CUDA passes: {why}")
    return cfg


def launch(step: RingStep, cfg: RingDecodeConfig) -> None:
    """Run one checked step with ``cfg`` (the engine's launches, in order)."""
    if cfg.engine == "cuda":
        run_passes(step, cfg)
    elif cfg.engine == "slices":
        launch_read(step, cfg)
        launch_rows(step, cfg, FLUSH_ROWS)
    elif cfg.split:
        launch_rows(step, cfg, NON_FLUSH_ROWS)
        launch_rows(step, cfg, FLUSH_ROWS)
    else:
        launch_rows(step, cfg, ALL_ROWS)


def ring_decode(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    d_cache: torch.Tensor,
    k_cache: torch.Tensor,
    g_cache: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    force_flush: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    is_kda: bool = False,
    *,
    config: RingDecodeConfig | None = None,
    ring_map: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One ReplaySSM decode step for a batch, in place (module docstring).

    Args: SGLang's (shapes in :func:`~.ring_decode_args.check_ring_decode_args`); ``config``:
    the launch (None: :func:`pick_config`'s, the CUDA passes where they fit and build; a config
    with ``engine="cuda"`` raises :class:`~.ring_decode_cuda.CudaReadUnsupported` when the inputs
    do not fit them); ``ring_map`` (int32 ``[slots]``): slot ``s``'s records live in ring row
    ``ring_map[s]`` (the ring tensors then hold their own rows; Triton only).

    Writes ``out`` (``[B, 1, HV, V]``) for every row, appends one ring record for non-flush rows
    and rewrites ``initial_state[slot]`` for flush rows. Does not advance ``write_pos``. Returns
    ``(out, initial_state)`` like SGLang's wrapper.
    """
    step = checked_step(
        mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, d_cache, k_cache, g_cache, out,
        ssm_state_indices, write_pos, force_flush, use_qk_l2norm_in_kernel, is_kda, ring_map,
    )  # fmt: skip
    if step.shape.B == 0:
        return out, initial_state
    if config is None:
        config = default_config(step)
    elif config.engine == "cuda":
        why = cuda_unfit(step, forced=True)
        if why is not None:
            raise CudaReadUnsupported(f"engine='cuda': {why}")
    launch(step, config)
    return out, initial_state

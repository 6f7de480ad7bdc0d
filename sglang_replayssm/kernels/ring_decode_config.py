"""The ring decode's launch configuration: the knobs :func:`.ring_decode.pick_config` sets.

Kept apart from the policy (:mod:`.ring_decode`) so that the backends can take it without
importing the entry point. Research-only knobs (other flush folds, register caps, tile orders,
bulk copies, ...) are not here: they live in ``lab/kernels/ring_decode_research.py``.
"""

from __future__ import annotations

import dataclasses

__all__ = ["ENGINES", "RingDecodeConfig"]

#: ``regs``: :mod:`.ring_decode_triton` (row chunks prefetched into registers); ``slices``: the
#: non-flush rows by :mod:`.ring_decode_slices`, flush rows by the Triton flush pass; ``cuda``:
#: both passes of ``csrc/ring_read.cu`` through :mod:`.ring_decode_cuda`.
ENGINES = ("regs", "slices", "cuda")


@dataclasses.dataclass(frozen=True)
class RingDecodeConfig:
    """One launch choice (immutable; :func:`dataclasses.replace` makes a variant).

    Triton (``engine`` ``"regs"``, and the flush pass of ``"slices"``):

    * ``block_v``: V rows per streamed chunk (a power of two, clamped to ``V``);
      ``v_split``: programs per (row, value head), each streaming ``V / v_split`` rows;
      ``num_warps``: warps per program.
    * ``prefetch``: chunks in flight ahead of the one being computed (1 or 2, ``"regs"`` only).
    * ``split``: two launches per step, non-flush rows (compiled without the flush path) and
      flush rows; always on for ``"slices"`` and ``"cuda"``. ``flush_block_v`` /
      ``flush_num_warps``: chunk height / warps of the flush launch (None: as the first launch).
    * ``row_major``: program order, the heads of one row consecutive (one contiguous slot).
    * ``slice_k``: column-slice width of the ``"slices"`` read pass (a power of two >= 4).

    CUDA (``engine="cuda"``, ``csrc/ring_read.cu``):

    * ``cuda_warps``: (row, head) pairs per block; ``cuda_min_blocks`` /
      ``cuda_flush_min_blocks``: register budget of the non-flush / flush pass, as blocks resident
      per SM; ``cuda_stages`` / ``cuda_flush_stages``: checkpoint chunks staged per warp through
      ``cp.async`` (0: two register buffers). Each of these four picks a build of the source.
    * ``cuda_flush_waves``: the flush pass's grid cap in resident sets of blocks (0: one warp per
      (row, head) item); ``cuda_tail``: the non-flush pass's last items served in halves
      (quarters of the resident warps; 0: none); ``cuda_overlap``: the flush pass on a side
      stream, concurrent with the non-flush pass; ``cuda_fused`` > 0: both passes' work in one
      launch instead (flush items first, each item by its pass's code: the same outputs), built
      with a register budget of that many blocks per SM (0: two launches).
    """

    block_v: int
    v_split: int
    num_warps: int
    prefetch: int
    split: bool
    engine: str = "regs"
    slice_k: int = 32
    flush_block_v: int | None = None
    flush_num_warps: int | None = None
    row_major: bool = False
    cuda_warps: int = 4
    cuda_min_blocks: int = 4
    cuda_flush_min_blocks: int = 1
    cuda_stages: int = 0
    cuda_flush_stages: int = 0
    cuda_flush_waves: int = 0
    cuda_tail: int = 0
    cuda_overlap: bool = False
    cuda_fused: int = 0

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be 'regs', 'slices' or 'cuda' (got {self.engine!r})")
        if self.prefetch not in (1, 2):
            raise ValueError(f"prefetch must be 1 or 2 (got {self.prefetch})")
        if self.cuda_warps not in (1, 2, 4):
            raise ValueError(f"cuda_warps must be 1, 2 or 4 (got {self.cuda_warps})")
        if self.cuda_fused < 0:
            raise ValueError(f"cuda_fused must be >= 0 (got {self.cuda_fused})")
        if self.cuda_flush_waves < 0 or self.cuda_tail < 0:
            raise ValueError(f"cuda_flush_waves and cuda_tail must be >= 0 (got {self.cuda_flush_waves}, "
                             f"{self.cuda_tail})")  # fmt: skip

    def split_launch(self) -> bool:
        """Whether non-flush and flush rows run in separate launches."""
        return self.split or self.engine != "regs"

    def fit(self, V: int) -> tuple[int, int]:
        """``(block_v, flush_block_v)`` clamped to this ``V``; ``ValueError`` when they do not tile it.

        ``block_v`` is clamped to ``V`` and ``flush_block_v`` (None: ``block_v``) to ``V / v_split``.
        """
        bv = min(self.block_v, V)
        if bv <= 0 or bv & (bv - 1) or V % (bv * self.v_split) != 0:
            raise ValueError(f"block_v={bv} must be a power of two with block_v * v_split dividing V={V}")
        per = V // self.v_split
        fbv = min(self.flush_block_v if self.flush_block_v is not None else bv, per)
        if self.split_launch() and (fbv <= 0 or fbv & (fbv - 1) or per % fbv != 0):
            raise ValueError(f"flush_block_v={fbv} must be a power of two dividing V/v_split={per}")
        return bv, fbv

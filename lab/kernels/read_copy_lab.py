"""The read-copy decode's research builds: :class:`LabReadCopyConfig` adds the build options the product
source no longer compiles, built from ``lab/kernels/csrc/read_copy.cu`` (the full source, every
``RC_*`` option; it includes the product's ``ring_read.cu``).

Use it wherever :class:`~sglang_replayssm.kernels.read_copy_cuda.ReadCopyCudaConfig` goes
(``read_copy_decode_cuda(..., config=LabReadCopyConfig(...))``, ``build(kind=LabReadCopyConfig, ...)``):
the launcher builds and loads the lab source for it. Options beyond the product's:

``tc_flush``: GDN's flush pass in the Gram form on tensor cores (3xTF32, ``flush_item_tc``; KDA keeps the
sequential replay); ``d_tile`` (with ``stages`` 0): the live ``d~`` records copied to shared memory once
per (row, head) instead of loaded with every chunk; ``flush_rows`` N >= 1: the flush pass in the row
layout (one block of 256 threads per flush (row, head), two threads replaying each state row against
per-column key tables in shared memory; N blocks per SM; ``flush_parts`` must then be 1 or None);
``flush_pipe``: the row layout pipelined, one 384-thread block per SM whose 4 setup warps prepare the next
item while 8 replay warps run the current one; ``flush_min_blocks`` N >= 1: the warp-layout flush pass
compiled for N resident one-warp blocks per SM, 0: uncapped; ``flush_pair``: the warp-layout flush pass
replays two 16-row blocks together (excludes ``flush_prefetch``); ``tc_read`` (with ``stages``): the
staged non-flush pass sums each chunk's rows on tensor cores (mma.m16n8k16); ``flush_tile`` 2: the tile
layout replaying two blocks together (excludes ``flush_prefetch``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

from sglang_replayssm.kernels.read_copy_cuda import ReadCopyCudaConfig, _build

__all__ = ["LAB_SOURCE", "LabReadCopyConfig", "as_lab"]

#: the full read-copy source: the product's builds and every research option
LAB_SOURCE = Path(__file__).parent / "csrc" / "read_copy.cu"


@dataclasses.dataclass(frozen=True)
class LabReadCopyConfig(ReadCopyCudaConfig):
    """:class:`ReadCopyCudaConfig` plus the research build options (module docstring), built from
    :data:`LAB_SOURCE`. At the product's values of these options a build compiles to the product's
    code (``lab/scripts/read_copy_sass_same.py`` compares the SASS)."""

    SOURCE: ClassVar[Path] = LAB_SOURCE

    tc_flush: bool = _build("RC_TC_FLUSH", "_tc", False)
    d_tile: bool = _build("RC_DTILE", "_dt", False)
    flush_rows: int = _build("RC_FLUSH_ROWS", "_fr", 0)
    flush_pipe: bool = _build("RC_FLUSH_PIPE", "_pipe", False)
    flush_min_blocks: int = _build("RC_FLUSH_MIN_BLOCKS", "_fm", 0)
    flush_pair: bool = _build("RC_FLUSH_PAIR", "_fp2", False)
    tc_read: bool = _build("RC_TC_READ", "_tcr", False)

    @classmethod
    def check_build(cls, opts: dict[str, Any]) -> None:
        """The values and combinations the lab source compiles (its static_asserts)."""
        ReadCopyCudaConfig.check_build({**opts, "flush_tile": min(opts["flush_tile"], 1),
                                        "read_rows": opts["read_rows"] and not opts["tc_read"]})
        flush_rows, flush_pipe, flush_tile = opts["flush_rows"], opts["flush_pipe"], opts["flush_tile"]
        if not 0 <= flush_rows <= 4:
            raise ValueError(f"flush_rows must be 0..4 (got {flush_rows})")
        if flush_rows and flush_pipe:
            raise ValueError("flush_rows and flush_pipe are two flush layouts: pick one")
        if not 0 <= opts["flush_min_blocks"] <= 32:
            raise ValueError(f"flush_min_blocks must be 0..32 (got {opts['flush_min_blocks']})")
        if opts["flush_pair"] and opts["flush_prefetch"]:
            raise ValueError("flush_pair takes the registers flush_prefetch needs: pick one")
        if opts["tc_read"] and not opts["stages"]:
            raise ValueError("tc_read reads staged chunks: it needs stages >= 2")
        if opts["read_rows"] and opts["tc_read"]:
            raise ValueError("read_rows reads staged chunks: it needs stages >= 2 and not tc_read")
        if flush_tile not in (0, 1, 2):
            raise ValueError(f"flush_tile must be 0, 1 or 2 (got {flush_tile})")
        if flush_tile and (opts["flush_pair"] or flush_rows or flush_pipe):
            raise ValueError("flush_tile is a warp-layout flush with its own paired replay (2): not with flush_pair, "
                             "flush_rows or flush_pipe")
        if flush_tile == 2 and opts["flush_prefetch"]:
            raise ValueError("flush_tile 2 takes the registers flush_prefetch needs: pick one")

    def row_layout_flush(self) -> bool:
        """Whether the flush pass runs in a row layout (``flush_rows`` or ``flush_pipe``)."""
        return bool(self.flush_rows or self.flush_pipe)


def as_lab(config: ReadCopyCudaConfig, **changes: Any) -> LabReadCopyConfig:
    """``config``'s fields (the research options at their defaults unless ``changes`` sets them) as a lab config."""
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    return LabReadCopyConfig(**{**fields, **changes})

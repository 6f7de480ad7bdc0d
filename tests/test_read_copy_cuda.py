"""read_copy_decode_cuda == read_copy_decode_torch step by step, and its flushes == the fp64 oracle (GPU);
its launch defaults and refusals (CPU).

The shapes the CUDA source is compiled for (K = V = 128, L = 16), bf16 io, rows at staggered
cursors with forced flushes in the first window (flush and non-flush rows in every step), NaN in
every ring record not yet valid, GDN (two value heads per key head) and KDA, bf16 and fp8 copies,
each flush pass split over 1 and 4 warps per (row, head), with and without the side stream.
"""

from __future__ import annotations

import dataclasses
import math
import re
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sglang_replayssm.kernels.read_copy_format import alloc_read_copy
from sglang_replayssm.kernels.read_copy_ref import read_copy_decode_torch
from tests.support.read_copy_bench_drift import make_inputs, rel, run_copy, run_oracle

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (nvcc builds the source)")

L = 16


def _bf16_io(fn: Any, **extra: object) -> Any:
    """``fn`` with ``a`` and ``out`` in bf16 (the CUDA passes take one io dtype); the same wrapper runs the reference."""

    def run(qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *rest: Any, **kw: Any) -> None:
        out = rest[11]  # after A_log, dt_bias, scale, state, copy, scales and the five rings
        o = torch.empty_like(out, dtype=torch.bfloat16)
        fn(qkv, a.to(torch.bfloat16), b, *rest[:11], o, *rest[12:], **kw, **extra)
        out.copy_(o.float())

    return run


@pytest.fixture
def _on_cuda() -> Any:
    torch.set_default_device("cuda")
    yield
    torch.set_default_device("cpu")


def test_default_flush_parts_follow_the_flush_rows() -> None:
    from sglang_replayssm.kernels.read_copy_cuda import default_flush_parts

    assert [default_flush_parts(B, 32, 16) for B in (1, 64, 256, 512, 4096)] == [4, 4, 2, 1, 1]


def test_build_refuses_bad_values() -> None:
    """``build`` checks its options before it looks for nvcc (CPU); the research options are the lab's."""
    from sglang_replayssm.kernels.read_copy_cuda import build

    with pytest.raises(ValueError, match="stages must be"):
        build("90a", stages=1)
    with pytest.raises(ValueError, match="read_warps must be 1, 2 or 4"):
        build("90a", read_warps=3)
    with pytest.raises(ValueError, match="flush_tile must be 0 or 1"):
        build("90a", flush_tile=2)
    with pytest.raises(ValueError, match="read_rows reads staged chunks"):
        build("90a", read_rows=True)
    with pytest.raises(TypeError, match="unknown build options"):
        build("90a", flush_pair=True)  # a research option: the lab config's


def test_lab_build_refuses_two_flush_layouts_and_bad_values() -> None:
    """The lab source's options, checked the same way (CPU)."""
    from functools import partial

    from lab.kernels.read_copy_lab import LabReadCopyConfig
    from sglang_replayssm.kernels.read_copy_cuda import build as product_build

    build = partial(product_build, kind=LabReadCopyConfig)
    with pytest.raises(ValueError, match="two flush layouts"):
        build("90a", flush_rows=2, flush_pipe=True)
    with pytest.raises(ValueError, match="flush_rows must be 0..4"):
        build("90a", flush_rows=5)
    with pytest.raises(ValueError, match="stages must be"):
        build("90a", stages=1)
    with pytest.raises(ValueError, match="flush_min_blocks must be 0..32"):
        build("90a", flush_min_blocks=33)
    with pytest.raises(ValueError, match="read_warps must be 1, 2 or 4"):
        build("90a", read_warps=3)
    with pytest.raises(ValueError, match="flush_pair takes the registers"):
        build("90a", flush_pair=True, flush_prefetch=True)
    with pytest.raises(ValueError, match="tc_read reads staged chunks"):
        build("90a", tc_read=True)
    with pytest.raises(ValueError, match="flush_tile is a warp-layout flush"):
        build("90a", flush_tile=1, flush_pair=True)
    with pytest.raises(ValueError, match="flush_tile is a warp-layout flush"):
        build("90a", flush_tile=1, flush_rows=2)
    with pytest.raises(ValueError, match="flush_tile 2 takes the registers"):
        build("90a", flush_tile=2, flush_prefetch=True)
    with pytest.raises(ValueError, match="flush_tile must be 0, 1 or 2"):
        build("90a", flush_tile=3)
    with pytest.raises(ValueError, match="read_rows reads staged chunks"):
        build("90a", read_rows=True)
    with pytest.raises(ValueError, match="read_rows reads staged chunks"):
        build("90a", read_rows=True, stages=4, tc_read=True)


def test_build_options_are_the_sources_macros() -> None:
    """The one field list: every ``#ifndef RC_*`` option of the product read_copy.cu is a product build field
    and back, and the same for the lab source and the lab config (CPU)."""
    from lab.kernels.read_copy_lab import LabReadCopyConfig
    from sglang_replayssm.kernels import read_copy_cuda as rcc

    for kind in (rcc.ReadCopyCudaConfig, LabReadCopyConfig):
        text = kind.SOURCE.read_text()
        macros = {f.metadata["build"].macro for f in kind.build_fields()}
        assert macros == set(re.findall(r"^#ifndef (RC_\w+)", text, re.M)), kind
    assert rcc.BUILD_FIELDS == rcc.ReadCopyCudaConfig.build_fields()


def test_product_fields_are_the_ones_default_config_sets() -> None:
    """Every product build field takes more than one value over the serving shapes' default configs (CPU):
    the product source keeps only the choices :func:`default_config` makes."""
    from sglang_replayssm.kernels import read_copy_cuda as rcc

    cfgs = [rcc.default_config(B, 32, 16, kda, fmt) for B in (1, 64, 128, 256, 512) for kda in (False, True)
            for fmt in ("bf16", "fp8")]
    always_same = {f.name for f in rcc.BUILD_FIELDS if len({getattr(c, f.name) for c in cfgs}) == 1}
    assert always_same <= {"depth", "fp8_recip"}  # set by default_config, one value each today


def test_build_derives_macros_name_and_refusals_from_the_field_list(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Any) -> None:
    """Each build field reaches nvcc as its macro and the .so name as its tag; an unknown option is refused (CPU)."""
    from sglang_replayssm.kernels import read_copy_cuda as rcc

    seen: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(rcc, "nvcc_shared", lambda src, so, arch, flags: seen.append((so.name, flags)) or so)
    cfg = rcc.default_config(512, 32, 16, False)
    rcc.build("90a", out_dir=tmp_path, **rcc.build_options(cfg))
    name, flags = seen[-1]
    assert name.startswith("read_copy_90a_d2_m5_pf_rcp_st4_rw1_ftl1_rr_")
    assert [f for f in flags if f.startswith("-D")] == [
        "-DRC_DEPTH=2", "-DRC_MIN_BLOCKS=5", "-DRC_FLUSH_PREFETCH=1", "-DRC_FP8_RECIP=1", "-DRC_STAGES=4",
        "-DRC_READ_WARPS=1", "-DRC_FLUSH_TILE=1", "-DRC_READ_ROWS=1"]
    rcc.build("90a", out_dir=tmp_path)
    assert re.fullmatch(r"read_copy_90a_d3_m3_[0-9a-f]{16}\.so", seen[-1][0])  # defaults: no other tag
    with pytest.raises(TypeError, match="unknown build options"):
        rcc.build("90a", out_dir=tmp_path, flush_parts=2)  # a launch argument, not a build option


def test_lab_config_loads_a_build_of_the_lab_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """A :class:`LabReadCopyConfig` launch loads a build of the lab source with its research macros; a product
    config one of the product source; a lab config at the product's options is a build of its own (CPU)."""
    from lab.kernels.read_copy_lab import LAB_SOURCE, LabReadCopyConfig, as_lab
    from sglang_replayssm.kernels import read_copy_cuda as rcc

    seen: list[tuple[Any, list[str]]] = []
    monkeypatch.setattr(rcc, "_arch", lambda: "90a")
    monkeypatch.setattr(rcc, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(rcc, "nvcc_shared", lambda src, so, arch, flags: seen.append((src, flags)) or so)
    monkeypatch.setattr(rcc.ctypes, "CDLL", lambda path: SimpleNamespace(read_copy_launch=SimpleNamespace()))
    monkeypatch.setattr(rcc, "_LIBS", {})
    d = rcc.default_config(512, 32, 16, False)
    rcc._lib(LabReadCopyConfig(flush_pair=True))
    rcc._lib(d)
    rcc._lib(as_lab(d))
    assert [src for src, _ in seen] == [LAB_SOURCE, rcc.ReadCopyCudaConfig.SOURCE, LAB_SOURCE]
    assert "-DRC_FLUSH_PAIR=1" in seen[0][1] and not any("FLUSH_PAIR" in f for f in seen[1][1])
    assert len(rcc._LIBS) == 3


def test_cpu_tensors_refused_with_the_reason() -> None:
    from sglang_replayssm.kernels.read_copy_cuda import read_copy_decode_cuda
    from sglang_replayssm.kernels.ring_decode_cuda import CudaReadUnsupported

    inp = make_inputs(1, 2, 2, 4, 128, 128, False)
    n, HV = 3, 4
    copy, _ = alloc_read_copy(n, HV, 128, 128, "bf16", False, device="cpu")
    rings = [torch.zeros(n, HV, L, 128, dtype=torch.bfloat16), torch.zeros(n, 2, L, 128), torch.zeros(n, HV, L),
             torch.zeros(n, HV, L, 128, dtype=torch.bfloat16), torch.zeros(n, HV, L)]  # fmt: skip
    with pytest.raises(CudaReadUnsupported, match="not on a CUDA device"):
        read_copy_decode_cuda(inp.qkv[0].cpu(), inp.a[0].cpu().to(torch.bfloat16), inp.b[0].cpu(), inp.A_log.cpu(),
                              inp.dt_bias.cpu(), 0.25, torch.zeros(n, HV, 128, 128), copy, None, *rings,
                              torch.zeros(2, 1, HV, 128, dtype=torch.bfloat16), torch.tensor([1, 2], dtype=torch.int32),
                              torch.zeros(2, dtype=torch.int32))  # fmt: skip


@gpu
@pytest.mark.usefixtures("_on_cuda")
@pytest.mark.parametrize("is_kda", [False, True])
@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
@pytest.mark.parametrize("parts,overlap,tc,prefetch,recip,stages,rows", [
    (1, False, False, False, False, 0, 0), (4, True, False, False, False, 0, 0), (1, True, True, False, False, 0, 0),
    (2, False, True, False, False, 0, 0), (1, True, False, True, False, 0, 0), (2, True, True, True, False, 0, 0),
    (1, True, False, True, True, 0, 0), (4, True, True, False, True, 0, 0), (1, True, False, True, True, 4, 0),
    (4, False, False, False, True, 3, 0), (2, True, False, False, True, 6, 0), (0, True, False, False, False, 0, 0),
    (1, True, False, False, True, 4, 2), (1, False, False, False, False, 0, 1), (0, True, False, True, True, 4, 1),
    (1, True, False, False, True, 4, -1), (1, False, False, False, False, 0, -1)])  # fmt: skip
def test_cuda_matches_reference_and_oracle(fmt: str, is_kda: bool, parts: int, overlap: bool, tc: bool,
                                           prefetch: bool, recip: bool, stages: int, rows: int) -> None:
    """``tc``: GDN's flush pass in the Gram form on tensor cores (KDA: the same build, sequential flush);
    ``prefetch``: the flush pass loads the next block's rows during the current one; ``recip``: the
    fp8 copy written with a reciprocal per row; ``stages``: the non-flush pass's chunks staged in
    shared memory (0: in registers); ``rows``: the flush pass in the row layout, that many blocks
    per SM (0: the warp layout; -1: the pipelined row layout); ``parts`` 0: no config (:func:`default_config`; with ``rows`` set:
    the default config with that flush layout)."""
    from lab.kernels.read_copy_lab import LabReadCopyConfig as ReadCopyCudaConfig  # the lab build
    from lab.kernels.read_copy_lab import as_lab
    from sglang_replayssm.kernels.read_copy_cuda import default_config

    cfg = ReadCopyCudaConfig(flush_parts=None if rows else parts, overlap=overlap, tc_flush=tc,
                             flush_prefetch=prefetch, fp8_recip=recip, stages=stages, flush_rows=max(rows, 0),
                             flush_pipe=rows < 0) if parts else None
    if not parts and rows:
        d = default_config(20, 4, L, is_kda, fmt)  # the helper's 20 rows, HV = 4
        cfg = as_lab(d, flush_parts=None, flush_rows=rows)
    _assert_matches_reference(fmt, is_kda, cfg)


def _assert_matches_reference(fmt: str, is_kda: bool, cfg: object, rows: int = 20, strong: bool = False) -> None:
    """The CUDA passes under ``cfg`` against the torch reference step by step (2L+3 staggered steps,
    ``rows`` rows) and every flushed checkpoint against the reference and the fp64 oracle;
    ``strong``: the decays of :func:`_strong_decays`."""
    from sglang_replayssm.kernels.read_copy_cuda import read_copy_decode_cuda

    H, HV = (4, 4) if is_kda else (2, 4)
    inp = make_inputs(2 * L + 3, rows, H, HV, 128, 128, is_kda, seed=5)
    if strong:
        _strong_decays(inp, HV, is_kda)
    inp.a = inp.a.to(torch.bfloat16).float()  # what the bf16-io kernel sees, for the oracle too
    bf = torch.bfloat16  # the d~ ring in the io dtype
    ref = run_copy(inp, fmt, L, decode=_bf16_io(read_copy_decode_torch), d_dtype=bf)  # type: ignore[arg-type]
    got = run_copy(inp, fmt, L, decode=_bf16_io(read_copy_decode_cuda, config=cfg), d_dtype=bf)  # type: ignore[arg-type]
    err = rel(got.out, ref.out, (3,))  # [T, B, HV]
    flush = torch.zeros(err.shape[:2], dtype=torch.bool)
    for t, r, _ in ref.flushed:
        flush[t, r] = True
    # bf16 outputs: one bf16 rounding apart at most
    assert float(err[flush].max()) <= 8e-3
    assert float(err[~flush].median()) <= 8e-3
    assert float(err[~flush].max()) <= (1.2e-2 if fmt == "bf16" else 4e-2)
    assert len(got.flushed) == len(ref.flushed) >= 2 * rows
    _, oracle = run_oracle(inp, states_at={t for t, _, _ in ref.flushed})
    for (t, r, c), (t2, r2, c2) in zip(got.flushed, ref.flushed, strict=True):
        assert (t, r) == (t2, r2)
        assert float(rel(c, c2)) <= 1e-5, (t, r)  # fp32, reassociated
        assert float(rel(c, oracle[t][r])) <= 1e-5, (t, r)  # fp32 decode's own distance to fp64


@gpu
@pytest.mark.usefixtures("_on_cuda")
@pytest.mark.parametrize("is_kda", [False, True])
@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
@pytest.mark.parametrize("fmin,warps,stages,pair,parts", [
    (12, 4, 4, False, 2), (0, 1, 4, False, 2), (12, 1, 0, False, 2), (0, 2, 0, False, 2), (0, 1, 4, True, 1),
    (0, 4, 4, True, 2), (0, 1, 0, True, 4), (0, 1, 4, True, 8)])  # fmt: skip
def test_cuda_launch_shapes_match_reference(fmt: str, is_kda: bool, fmin: int, warps: int, stages: int, pair: bool,
                                            parts: int) -> None:
    """The flush pass under a register cap (``flush_min_blocks``) or with two blocks replayed
    together (``flush_pair``; parts 8 leaves one 16-row block per warp), the non-flush pass in one-,
    two- and four-warp blocks (``read_warps``), staged and register path, against the reference and
    the oracle."""
    from lab.kernels.read_copy_lab import LabReadCopyConfig as ReadCopyCudaConfig  # the lab build

    cfg = ReadCopyCudaConfig(depth=2, min_blocks=4, flush_parts=parts, flush_prefetch=not pair, fp8_recip=True,
                             stages=stages, flush_min_blocks=fmin, read_warps=warps, flush_pair=pair)
    _assert_matches_reference(fmt, is_kda, cfg)


@gpu
@pytest.mark.usefixtures("_on_cuda")
@pytest.mark.parametrize("is_kda", [False, True])
@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
@pytest.mark.parametrize("warps,strong", [(1, False), (4, False), (1, True)])
@pytest.mark.parametrize("read", ["tc_read", "read_rows"])
def test_cuda_staged_read_layouts_match_reference(fmt: str, is_kda: bool, warps: int, strong: bool, read: str) -> None:
    """The staged non-flush pass with its row sums on tensor cores (``tc_read``) or with eight lanes per
    copy row (``read_rows``: 16 columns of two rows each) against the reference and the oracle, in one-
    and four-warp blocks (each warp its own scratch / read-out vectors), and with decays under ~0.006
    per step (``strong``: read-out vectors down to ~1e-30, which tc_read's f16 operands for the fp8
    copy hold only through the power-of-two prescale)."""
    from lab.kernels.read_copy_lab import LabReadCopyConfig as ReadCopyCudaConfig  # the lab build

    cfg = ReadCopyCudaConfig(depth=2, min_blocks=4, flush_parts=1, flush_prefetch=True, fp8_recip=True, stages=4,
                             read_warps=warps, flush_per_sm=4, tc_read=read == "tc_read",
                             read_rows=read == "read_rows")
    _assert_matches_reference(fmt, is_kda, cfg, strong=strong)


@gpu
@pytest.mark.usefixtures("_on_cuda")
@pytest.mark.parametrize("is_kda", [False, True])
@pytest.mark.parametrize("launch", ["prefetch", "pair", "default"])
def test_cuda_flush_warps_taking_several_items_match_reference(is_kda: bool, launch: str) -> None:
    """``flush_per_sm`` 1: one flush warp per SM; 320 rows at 8 parts give ~640 flush items per step
    (more than any H100 / H200 has SMs), so every flush warp replays several items in turn; and
    :func:`default_config`'s launch above 256 flush pairs (4 flush warps per SM, one part) on these rows."""
    from lab.kernels.read_copy_lab import LabReadCopyConfig as ReadCopyCudaConfig  # the lab build
    from sglang_replayssm.kernels.read_copy_cuda import default_config

    pair = launch == "pair"
    cfg = ReadCopyCudaConfig(depth=2, min_blocks=4, flush_parts=8, flush_prefetch=not pair, fp8_recip=True,
                             stages=4, read_warps=1, flush_pair=pair, flush_per_sm=1)
    if launch == "default":
        cfg = default_config(512, 32, L, is_kda)
        assert cfg.flush_per_sm and cfg.stages
    _assert_matches_reference("bf16", is_kda, cfg, rows=320)


@gpu
@pytest.mark.usefixtures("_on_cuda")
@pytest.mark.parametrize("is_kda", [False, True])
@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
@pytest.mark.parametrize("tile", [1, 2])
@pytest.mark.parametrize("launch", ["staged", "parts", "strong", "items"])
def test_cuda_tile_flush_matches_reference(fmt: str, is_kda: bool, tile: int, launch: str) -> None:
    """The flush pass in the tile layout (``flush_tile`` 1: lanes own 4 rows x 16 columns of a block, the
    item's key tables built once; 2: two blocks at a time) against the reference and the oracle: on
    :func:`default_config`'s launch above 256 flush pairs (staged non-flush pass, 4 flush warps per
    SM; prefetch with tile 1); on the register path with 2 parts; with decays under ~0.006 per step
    (``strong``: the tables' renormalisation steps); and with 320 rows at 8 parts (one block per part:
    tile 2's single-block path) on one flush warp per SM (``items``: each warp rebuilds its tables
    for several items in turn; the non-flush pass with ``read_rows`` beside it)."""
    from lab.kernels.read_copy_lab import LabReadCopyConfig as ReadCopyCudaConfig  # the lab build
    from lab.kernels.read_copy_lab import as_lab
    from sglang_replayssm.kernels.read_copy_cuda import default_config

    cfg = as_lab(default_config(512, 32, L, is_kda, fmt), flush_tile=tile, flush_prefetch=tile == 1,
                              read_rows=launch == "items")
    if launch == "parts":
        cfg = ReadCopyCudaConfig(depth=2, min_blocks=4, flush_parts=2, fp8_recip=True, flush_tile=tile)
    if launch == "items":
        cfg = dataclasses.replace(cfg, flush_parts=8, flush_per_sm=1)
    _assert_matches_reference(fmt, is_kda, cfg, rows=320 if launch == "items" else 20, strong=launch == "strong")


@gpu
@pytest.mark.usefixtures("_on_cuda")
def test_builds_in_one_process_keep_their_own_launch_state() -> None:
    """Two builds loaded in one process (as ``default_config`` does across batch sizes): each keeps its
    own flush grid and shared-memory attribute (internal linkage in ``read_copy.cu``; with external
    linkage the second build reused the first one's and its launch failed with cudaError 1)."""
    from sglang_replayssm.kernels import read_copy_cuda as rcc

    inp = make_inputs(L + 2, 6, 2, 4, 128, 128, False, seed=3)
    inp.a = inp.a.to(torch.bfloat16).float()
    bf = torch.bfloat16
    ref = run_copy(inp, "bf16", L, decode=_bf16_io(read_copy_decode_torch), d_dtype=bf)  # type: ignore[arg-type]
    from lab.kernels.read_copy_lab import LabReadCopyConfig  # flush_pipe: the lab build

    for cfg in (rcc.ReadCopyCudaConfig(stages=0), LabReadCopyConfig(stages=6, flush_pipe=True),
                rcc.ReadCopyCudaConfig(stages=3)):
        got = run_copy(inp, "bf16", L, decode=_bf16_io(rcc.read_copy_decode_cuda, config=cfg), d_dtype=bf)  # type: ignore[arg-type]
        assert len(got.flushed) == len(ref.flushed) >= 6
        for (t, r, c), (_, _, c2) in zip(got.flushed, ref.flushed, strict=True):
            assert float(rel(c, c2)) <= 1e-5, (cfg, t, r)


@gpu
@pytest.mark.usefixtures("_on_cuda")
@pytest.mark.parametrize("is_kda", [False, True])
@pytest.mark.parametrize("rows", [0, 2, -1, 3])
def test_cuda_flush_renormalises_strong_decays(is_kda: bool, rows: int) -> None:
    """Decays under ~0.006 per step (KDA: on half the key columns, the others 0.66-0.9996): the deferred decay
    falls under 2**-40 within a window, so the flush pass renormalises (the warp layout all columns
    at once, the row layout each column by itself); flushed checkpoints == the reference and fp64.
    ``rows`` 3: the warp layout with two blocks replayed together (``flush_pair``)."""
    from lab.kernels.read_copy_lab import LabReadCopyConfig as ReadCopyCudaConfig  # the lab build
    from sglang_replayssm.kernels.read_copy_cuda import read_copy_decode_cuda

    H, HV = (4, 4) if is_kda else (2, 4)
    inp = make_inputs(2 * L + 3, 12, H, HV, 128, 128, is_kda, seed=11)
    _strong_decays(inp, HV, is_kda)
    inp.a = inp.a.to(torch.bfloat16).float()
    bf = torch.bfloat16
    ref = run_copy(inp, "bf16", L, decode=_bf16_io(read_copy_decode_torch), d_dtype=bf)  # type: ignore[arg-type]
    cfg = ReadCopyCudaConfig(flush_parts=1, flush_rows=rows if rows in (0, 2) else 0, flush_pipe=rows < 0,
                             flush_pair=rows == 3)
    got = run_copy(inp, "bf16", L, decode=_bf16_io(read_copy_decode_cuda, config=cfg), d_dtype=bf)  # type: ignore[arg-type]
    assert len(got.flushed) == len(ref.flushed) >= 12
    _, oracle = run_oracle(inp, states_at={t for t, _, _ in ref.flushed})
    for (t, r, c), (t2, r2, c2) in zip(got.flushed, ref.flushed, strict=True):
        assert (t, r) == (t2, r2)
        assert float(rel(c, c2)) <= 1e-5, (t, r)
        assert float(rel(c, oracle[t][r])) <= 1e-5, (t, r)


def _strong_decays(inp: Any, HV: int, is_kda: bool) -> None:
    """Decays under ~0.006 per step (KDA: on half the key columns, the others 0.66-0.9996)."""
    inp.A_log = torch.full_like(inp.A_log, math.log(4.0))
    if is_kda:
        dt = inp.dt_bias.reshape(HV, 128).clone()
        dt[:, :64] += 10.0
        inp.dt_bias = dt.reshape(inp.dt_bias.shape)
    else:
        inp.dt_bias = inp.dt_bias + 10.0


@gpu
@pytest.mark.usefixtures("_on_cuda")
@pytest.mark.parametrize("is_kda", [False, True])
@pytest.mark.parametrize("stages,tc_read,tile,rows", [(0, False, False, False), (4, False, False, False),
                                                     (4, True, False, False), (4, False, True, False),
                                                     (4, False, False, True)])
def test_cuda_fp32_io_matches_reference(is_kda: bool, stages: int, tc_read: bool, tile: bool, rows: bool) -> None:
    """fp32 io (qkv, a, b, out and the d~ / v rings fp32): the staged non-flush pass copies two 16-byte
    pieces per d~ record and chunk instead of one; with ``tc_read`` its row sums (3-term bf16 split of
    the read-out vectors) stay within the fp32 reference's reassociation distance; ``tile``: the flush
    pass in the tile layout (fp32 outputs of its flush rows); ``rows``: four lanes per copy row
    (``read_rows``: the io's fp32 d~ pieces beside the fp32-read vectors)."""
    from lab.kernels.read_copy_lab import LabReadCopyConfig as ReadCopyCudaConfig  # the lab build
    from sglang_replayssm.kernels.read_copy_cuda import read_copy_decode_cuda

    H, HV = (4, 4) if is_kda else (2, 4)
    inp = make_inputs(2 * L + 3, 12, H, HV, 128, 128, is_kda, seed=7)
    inp.qkv, inp.b = inp.qkv.float(), inp.b.float()
    f32 = torch.float32
    ref = run_copy(inp, "bf16", L, decode=read_copy_decode_torch, d_dtype=f32, v_dtype=f32)
    cfg = ReadCopyCudaConfig(flush_parts=1, stages=stages, tc_read=tc_read, flush_tile=int(tile), read_rows=rows)

    def cuda(*args: Any, **kw: Any) -> Any:
        return read_copy_decode_cuda(*args, **kw, config=cfg)

    got = run_copy(inp, "bf16", L, decode=cuda, d_dtype=f32, v_dtype=f32)
    err = rel(got.out, ref.out, (3,))
    assert float(err.max()) <= 1e-3  # fp32 io: the reference's arithmetic reassociated (measured 1.3e-4)
    assert len(got.flushed) == len(ref.flushed) >= 12
    for (t, r, c), (t2, r2, c2) in zip(got.flushed, ref.flushed, strict=True):
        assert (t, r) == (t2, r2)
        assert float(rel(c, c2)) <= 1e-5, (t, r)


@gpu
@pytest.mark.usefixtures("_on_cuda")
@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_padding_rows_zero_and_untouched(fmt: str) -> None:
    from sglang_replayssm.kernels.read_copy_cuda import read_copy_decode_cuda

    inp = make_inputs(1, 2, 2, 4, 128, 128, False)
    n, HV = 3, 4
    state = torch.randn(n, HV, 128, 128)
    copy, scales = alloc_read_copy(n, HV, 128, 128, fmt, False, device="cuda")  # type: ignore[arg-type]
    rings = [torch.full((n, HV, L, 128), float("nan"), dtype=torch.bfloat16), torch.full((n, 2, L, 128), float("nan")),
             torch.full((n, HV, L), float("nan")), torch.full((n, HV, L, 128), float("nan"), dtype=torch.bfloat16),
             torch.full((n, HV, L), float("nan"))]  # fmt: skip
    before = [t.clone() for t in (state, copy, *rings)]
    out = torch.full((2, 1, HV, 128), 7.0, dtype=torch.bfloat16)
    slots = torch.tensor([-1, -1], dtype=torch.int32)
    wp = torch.tensor([0, L - 1], dtype=torch.int32)
    read_copy_decode_cuda(inp.qkv[0], inp.a[0].to(torch.bfloat16), inp.b[0], inp.A_log, inp.dt_bias, 0.25, state,
                          copy, scales, *rings, out, slots, wp, use_qk_l2norm_in_kernel=True)  # fmt: skip
    torch.cuda.synchronize()
    assert torch.all(out == 0)
    for x, y in zip((state, copy, *rings), before, strict=True):
        assert torch.equal(x.float().nan_to_num(1.5), y.float().nan_to_num(1.5))


@gpu
@pytest.mark.usefixtures("_on_cuda")
@pytest.mark.parametrize("is_kda", [False, True])
@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
@pytest.mark.parametrize("stages", [0, 4])
def test_cuda_on_records_carved_out_of_an_fp32_ring(fmt: str, is_kda: bool, stages: int) -> None:
    """``read_copy_d_ring``: ``d~`` / ``v`` as the two bf16 halves of each slot of one fp32 ring (slot stride
    ``2 * HV * L * V``, as ``radix/read_copy.attach`` carves SGLang's ``replayssm_d``): the CUDA passes take
    the slot strides, so outputs and flushed checkpoints are bit-equal to dense rings."""
    from sglang_replayssm.kernels.read_copy_cuda import ReadCopyCudaConfig, read_copy_decode_cuda

    H, HV = (4, 4) if is_kda else (2, 4)
    inp = make_inputs(2 * L + 3, 20, H, HV, 128, 128, is_kda, seed=7)
    cfg = ReadCopyCudaConfig(flush_parts=1, stages=stages)
    inp.a = inp.a.to(torch.bfloat16).float()
    bf = torch.bfloat16
    dense = run_copy(inp, fmt, L, decode=_bf16_io(read_copy_decode_cuda, config=cfg), d_dtype=bf)  # type: ignore[arg-type]
    carved = run_copy(inp, fmt, L, decode=_bf16_io(read_copy_decode_cuda, config=cfg), d_dtype=bf,  # type: ignore[arg-type]
                      records_in_ring=True)  # fmt: skip
    assert torch.equal(carved.out, dense.out)
    assert len(carved.flushed) == len(dense.flushed) >= 2 * 20
    for (t, r, c), (t2, r2, c2) in zip(carved.flushed, dense.flushed, strict=True):
        assert (t, r) == (t2, r2) and torch.equal(c, c2), (t, r)


def test_default_config_follows_the_flush_rows() -> None:
    """The product's launch by regime (docstring of :func:`default_config`): the register path while a
    step flushes at most 256 (row, head) pairs (4 flush warps per item); above, staged chunks in one-warp
    blocks, eight lanes per copy row, beside a flush grid of 4 warps per SM in the tile layout, one
    warp per item."""
    from sglang_replayssm.kernels.read_copy_cuda import default_config

    small, big = default_config(64, 32, 16, False), default_config(256, 32, 16, False)
    assert (small.stages, small.flush_parts) == (0, 4) and (big.stages, big.flush_parts) == (4, 1)
    assert [default_config(B, 32, 16, True).flush_parts for B in (64, 256, 512)] == [4, 1, 1]
    assert (big.read_warps, big.flush_per_sm, small.read_warps, small.flush_per_sm) == (1, 4, 4, 0)
    assert all(default_config(256, 32, 16, kda, fmt).min_blocks == 5 for kda in (False, True) for fmt in ("bf16", "fp8"))
    assert (big.flush_tile, big.read_rows, small.flush_tile, small.read_rows) == (1, True, 0, False)

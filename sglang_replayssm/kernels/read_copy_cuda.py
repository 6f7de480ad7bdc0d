"""Build, load and launch ``csrc/read_copy.cu``: the read-copy decode step's two passes in CUDA.

The function is :func:`.read_copy_ref.read_copy_decode_torch`'s (same arguments). The non-flush
pass reads the copy (bf16, or e4m3 with per-row fp32 scales) instead of the fp32 checkpoint and
appends the step's records (``d~`` and ``v`` in the io dtype, ``k``, ``g``, ``beta`` fp32; the flush
replays ``k``, ``g``, ``v``, ``beta``, so ``d~``'s precision reaches only non-flush outputs);
the flush pass replays the fp32 recurrence from the fp32 checkpoint over the window's raw records,
one record at a time, then this token, and writes the checkpoint and its copy. The passes serve
disjoint rows, so the flush pass runs on a side stream (two parallel nodes in a CUDA graph).

Compiled once per (sources, architecture, build options) with ``nvcc`` into the cache directory
of :mod:`.ring_decode_cuda` and loaded with ``ctypes``; launches go onto the current torch stream.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import logging
from pathlib import Path
from typing import Any, ClassVar

import torch

from .read_copy_ref import check_read_copy_args
from .ring_decode_args import check_fused_layout, check_ring_decode_args, prepare_step
from .ring_decode_cuda import CudaReadUnsupported, cache_dir, nvcc_shared

__all__ = [
    "BUILD_FIELDS", "DEFAULT_READ_COPY_BUILD", "BuildOption", "ReadCopyCudaConfig", "build", "build_options",
    "default_config", "default_flush_parts", "read_copy_decode_cuda", "read_copy_supports",
]  # fmt: skip

_DIR = Path(__file__).parent / "csrc"
_SRC = _DIR / "read_copy.cu"
_LOG = logging.getLogger("sglang_replayssm")
_LIBS: dict[tuple[object, ...], ctypes.CDLL] = {}  # (arch, config class, build fields) -> the loaded build
_IO = {torch.float32: 0, torch.bfloat16: 1}
#: (depth, min_blocks): chunks prefetched ahead by the non-flush pass, its register budget
DEFAULT_READ_COPY_BUILD = (3, 3)


@dataclasses.dataclass(frozen=True)
class BuildOption:
    """A compile-time option of ``read_copy.cu``: ``-D{macro}={int(value)}``, and ``{tag}{value}`` in the
    .so name (``{tag}`` alone for a bool) when the value is not the field's default, or ``always``."""

    macro: str
    tag: str
    always: bool = False


def _build(macro: str, tag: str, default: int | bool, always: bool = False) -> Any:
    """A :class:`ReadCopyCudaConfig` field that selects the build (its :class:`BuildOption` in the metadata)."""
    return dataclasses.field(default=default, metadata={"build": BuildOption(macro, tag, always)})


@dataclasses.dataclass(frozen=True)
class ReadCopyCudaConfig:
    """Launch choice: ``depth`` / ``min_blocks`` pick the build (:func:`build`); ``flush_parts``:
    warps per flush (row, value head), each replaying ``V / flush_parts`` rows (None:
    :func:`default_flush_parts`); ``flush_waves``: the flush grid in resident sets of one-warp blocks;
    ``overlap``: the flush pass on a side stream (``high_priority``: a high-priority one, so that its
    long items start first), else the flush pass before the non-flush pass on the current stream;
    ``flush_prefetch``: the flush pass requests the next 16-row block's state rows into registers
    while the current block computes; ``fp8_recip``: the fp8 copy is written as ``x * (448 / amax)``
    instead of IEEE ``x / (amax / 448)``; ``stages``: the non-flush pass stages its chunks (copy rows,
    ``d~`` tile, fp8 scales) in a cp.async ring of that many chunks per warp in shared memory, 0:
    ``depth`` chunks in registers; ``read_warps``: warps per block of the non-flush pass (1, 2 or 4,
    same register budget); ``flush_per_sm`` N >= 1: the flush grid is N one-warp blocks per SM, each
    taking several items (instead of ``flush_waves`` resident sets), so the non-flush pass keeps the
    rest of the register file; ``flush_tile`` 1: the flush pass with lanes owning 4 rows x 16 columns
    of a 16-row block (a row sum over 8 lanes, 7 shuffles a step instead of 32) against per-item key
    tables (``kt = c o k``, ``kh = k / c``) built once per item instead of per block; ``read_rows``
    (with ``stages``): the staged non-flush pass gives each copy row of a chunk to eight lanes (16
    columns of two rows each, the read-out vectors for them in registers), so a row sum is one shuffle
    round before the records' two instead of a reduce-scatter of 8 rows over 32.

    The fields made with ``_build`` select the compiled build (:meth:`build_fields`: its macros, .so
    name and cache key); the others are launch arguments of one build. The product source compiles
    the builds :func:`default_config` picks; the research builds (more build fields, their source
    ``lab/kernels/csrc/read_copy.cu``) are a subclass in ``lab.kernels.read_copy_lab``."""

    #: the CUDA source this config's builds compile (a subclass may name another with more options)
    SOURCE: ClassVar[Path] = _SRC

    depth: int = _build("RC_DEPTH", "_d", DEFAULT_READ_COPY_BUILD[0], always=True)
    min_blocks: int = _build("RC_MIN_BLOCKS", "_m", DEFAULT_READ_COPY_BUILD[1], always=True)
    flush_parts: int | None = None
    flush_waves: int = 1
    overlap: bool = True
    high_priority: bool = True
    flush_prefetch: bool = _build("RC_FLUSH_PREFETCH", "_pf", False)
    fp8_recip: bool = _build("RC_FP8_RECIP", "_rcp", False)
    stages: int = _build("RC_STAGES", "_st", 0)
    read_warps: int = _build("RC_READ_WARPS", "_rw", 4)
    flush_per_sm: int = 0
    flush_tile: int = _build("RC_FLUSH_TILE", "_ftl", 0)
    read_rows: bool = _build("RC_READ_ROWS", "_rr", False)

    @classmethod
    def build_fields(cls) -> tuple[dataclasses.Field, ...]:
        """The build-selecting fields of this config class, in declaration order."""
        return tuple(f for f in dataclasses.fields(cls) if "build" in f.metadata)

    @classmethod
    def check_build(cls, opts: dict[str, Any]) -> None:
        """The values and combinations :attr:`SOURCE` compiles (its static_asserts, checked before nvcc
        runs): ``ValueError`` naming the first one refused."""
        if not 1 <= opts["depth"] <= 6:
            raise ValueError(f"depth must be 1..6 (got {opts['depth']})")
        if opts["stages"] != 0 and not 2 <= opts["stages"] <= 8:
            raise ValueError(f"stages must be 0 or 2..8 (got {opts['stages']})")
        if opts["read_warps"] not in (1, 2, 4):
            raise ValueError(f"read_warps must be 1, 2 or 4 (got {opts['read_warps']})")
        if opts["read_rows"] and not opts["stages"]:
            raise ValueError("read_rows reads staged chunks: it needs stages >= 2")
        if opts["flush_tile"] not in (0, 1):
            raise ValueError(f"flush_tile must be 0 or 1 (got {opts['flush_tile']})")

    def row_layout_flush(self) -> bool:
        """Whether the flush pass runs one item per block (a research layout; ``flush_parts`` then 1)."""
        return False


#: The build-selecting fields of :class:`ReadCopyCudaConfig`, in declaration order: the one list from
#: which :func:`build` derives its options, defaults, nvcc macros, .so name and cache key, and the
#: loaded-build table its key.
BUILD_FIELDS: tuple[dataclasses.Field, ...] = ReadCopyCudaConfig.build_fields()


def build_options(config: ReadCopyCudaConfig) -> dict[str, int | bool]:
    """The build-selecting fields of ``config`` (name -> value, its class's :meth:`~ReadCopyCudaConfig.build_fields`
    order): ``build``'s options."""
    return {f.name: getattr(config, f.name) for f in type(config).build_fields()}


def default_flush_parts(B: int, HV: int, L: int) -> int:
    """Warps per flush (row, head) item: about 1024 flush warps for the ``B / L`` rows a staggered
    step flushes, 1, 2 or 4 (the H200 table's best: 4 at B=64, 2 or 1 at B=256, 1 at B=512, HV=32)."""
    pairs = max(1, B // max(L, 1)) * HV
    return 4 if pairs <= 256 else 2 if pairs <= 512 else 1


def default_config(B: int, HV: int, L: int, is_kda: bool, fmt: str = "bf16") -> ReadCopyCudaConfig:
    """The launch :func:`read_copy_decode_cuda` uses when given none, picked from the H200 sweeps of
    2026-12-02 and 2026-12-03 (staggered cursors, B = 64 / 256 / 512; notes/read-copy.md, "The flush
    grid", "Tiles and rows").

    Up to 256 flush (row, head) pairs per step (B <= 128 at HV = 32): the register-path non-flush
    build (depth 2, 4 blocks per SM) with 4 flush warps per item. Above: the non-flush pass stages
    4 chunks per warp in shared memory in one-warp blocks, eight lanes per copy row (``read_rows``;
    register budget 20 warps per SM); the flush pass in the tile layout (``flush_tile`` 1) prefetches
    the next block, one warp per item, on a grid of 4 warps per SM that take several items each, so
    the rest of the register file stays with the non-flush pass, which then runs beside the flush
    pass instead of after it. Every fp8 copy is written with a reciprocal per row. (``fmt`` chose
    the budget before ``read_rows``; every model and copy now takes the same.)"""
    del fmt
    pairs = max(1, B // max(L, 1)) * HV
    if pairs <= 256:
        return ReadCopyCudaConfig(depth=2, min_blocks=4, flush_parts=4, flush_prefetch=not is_kda, fp8_recip=True)
    return ReadCopyCudaConfig(depth=2, min_blocks=5, flush_parts=1, flush_prefetch=True, fp8_recip=True,
                              stages=4, read_warps=1, flush_per_sm=4, flush_tile=1, read_rows=True)


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"{major}{minor}{'a' if (major, minor) == (9, 0) else ''}"


def build(arch: str | None = None, depth: int = DEFAULT_READ_COPY_BUILD[0],
          min_blocks: int = DEFAULT_READ_COPY_BUILD[1], out_dir: Path | None = None, *,
          kind: type[ReadCopyCudaConfig] = ReadCopyCudaConfig, **options: int | bool) -> Path:
    """Compile ``kind.SOURCE`` (which includes ``ring_read.cu``) for ``arch`` unless cached; the .so path.

    ``options``: the other build fields of ``kind`` by name (default: the field's default); an unknown
    name is a ``TypeError``, an invalid value or combination a ``ValueError`` (both before nvcc is looked for)."""
    fields = kind.build_fields()
    defaults: dict[str, Any] = {f.name: f.default for f in fields}
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise TypeError(f"build() got unknown build options {unknown}; known: {sorted(defaults)}")
    opts: dict[str, Any] = {**defaults, **options, "depth": depth, "min_blocks": min_blocks}
    kind.check_build(opts)
    arch = arch or _arch()
    src = kind.SOURCE.read_bytes() + (_DIR / "ring_read.cu").read_bytes()
    tags = ""
    macros = [f"-I{_DIR}"]
    for f in fields:
        opt: BuildOption = f.metadata["build"]
        value = opts[f.name]
        macros.append(f"-D{opt.macro}={int(value)}")
        if opt.always or value != f.default:
            tags += opt.tag + ("" if isinstance(value, bool) else str(value))
    key = hashlib.sha256(src + f"{arch}{tags}".encode()).hexdigest()[:16]
    out_dir = out_dir or cache_dir()
    so = out_dir / f"{kind.SOURCE.stem}_{arch}{tags}_{key}.so"
    if so.exists():
        return so
    out_dir.mkdir(parents=True, exist_ok=True)
    _LOG.info("sglang-replayssm: building %s for sm_%s into %s (once)", kind.SOURCE.name, arch, out_dir)
    return nvcc_shared(kind.SOURCE, so, arch, macros)


def _lib(config: ReadCopyCudaConfig) -> ctypes.CDLL:
    """The loaded build of ``config`` (this device's architecture), built and loaded once."""
    options = build_options(config)
    key = (_arch(), type(config), *options.values())
    if key not in _LIBS:
        lib = ctypes.CDLL(str(build(_arch(), kind=type(config), **options)))  # type: ignore[arg-type]
        lib.read_copy_launch.restype = ctypes.c_int
        _LIBS[key] = lib
    return _LIBS[key]


def read_copy_supports(
    mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
    out: torch.Tensor, initial_state: torch.Tensor, read_copy: torch.Tensor, d_cache: torch.Tensor,
    k_cache: torch.Tensor, g_cache: torch.Tensor, v_cache: torch.Tensor, beta_cache: torch.Tensor,
    slots: torch.Tensor, K: int, V: int, L: int, scales: torch.Tensor | None = None,
) -> str | None:  # fmt: skip
    """``None`` when ``read_copy.cu`` handles these inputs, else the reason it does not."""
    if not mixed_qkv.is_cuda:
        return "tensors are not on a CUDA device"
    if (K, V) != (128, 128) or L > 16:
        return f"compiled for K = V = 128 and L <= 16 (got K={K}, V={V}, L={L})"
    io = mixed_qkv.dtype
    if io not in _IO or any(t.dtype != io for t in (a, b, out, d_cache, v_cache)):
        return "qkv, a, b, out and the d / v rings must share one dtype, fp32 or bf16"
    if any(t.dtype != torch.float32 for t in (A_log, dt_bias, initial_state, k_cache, g_cache, beta_cache)):
        return "A_log, dt_bias, the checkpoint and the k / g / beta rings must be fp32"
    if slots.dtype not in (torch.int32, torch.int64):
        return "ssm_state_indices must be int32 or int64"
    if not (A_log.is_contiguous() and dt_bias.is_contiguous()):
        return "A_log and dt_bias must be contiguous"
    for name, t in (("read_copy", read_copy), ("v_cache", v_cache), ("beta_cache", beta_cache)):
        if t.shape[0] and not t[0].is_contiguous():
            return f"{name} must be contiguous within a slot"
    # the staged non-flush pass copies 16-byte pieces of the copy rows, d~ rows and fp8 scales
    staged: list[tuple[str, torch.Tensor | None]] = [("read_copy", read_copy), ("d_cache", d_cache),
                                                     ("read_copy_scales", scales)]
    for name, x in staged:
        if x is not None and (x.data_ptr() % 16 or (x.shape[0] > 1 and x.stride(0) * x.element_size() % 16)):
            return f"{name} must be 16-byte aligned per slot"
    return None


def read_copy_decode_cuda(
    mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
    scale: float, initial_state: torch.Tensor, read_copy: torch.Tensor, read_copy_scales: torch.Tensor | None,
    d_cache: torch.Tensor, k_cache: torch.Tensor, g_cache: torch.Tensor, v_cache: torch.Tensor,
    beta_cache: torch.Tensor, out: torch.Tensor, ssm_state_indices: torch.Tensor, write_pos: torch.Tensor,
    force_flush: torch.Tensor | None = None, use_qk_l2norm_in_kernel: bool = False, is_kda: bool = False,
    *, config: ReadCopyCudaConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Arguments and effects of :func:`.read_copy_ref.read_copy_decode_torch`, fp8 scales per V row
    for both models (:mod:`.read_copy_format`); ``CudaReadUnsupported`` outside what the source is
    compiled for. No per-call range checks on cursors and slots (as for SGLang's kernel)."""
    shape = check_ring_decode_args(
        mixed_qkv, a, b, A_log, dt_bias, initial_state, d_cache, k_cache, g_cache, out,
        ssm_state_indices, write_pos, force_flush, is_kda,
    )  # fmt: skip
    cfg = config or default_config(shape.B, shape.HV, shape.L, is_kda, "fp8" if read_copy_scales is not None else "bf16")
    check_read_copy_args(read_copy, read_copy_scales, v_cache, beta_cache, initial_state, shape.L, is_kda)
    check_fused_layout(shape, mixed_qkv, a, b, dt_bias, initial_state, d_cache, k_cache, g_cache, out, is_kda)
    step = prepare_step(shape, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, d_cache, k_cache, g_cache,
                        out, ssm_state_indices, write_pos, force_flush, use_qk_l2norm_in_kernel, is_kda)  # fmt: skip
    why = read_copy_supports(step.qkv, step.a, step.b, step.A_log, step.dt_bias, out, initial_state, read_copy, d_cache,
                             k_cache, g_cache, v_cache, beta_cache, ssm_state_indices, shape.K, shape.V, shape.L,
                             read_copy_scales)
    if why is not None:
        raise CudaReadUnsupported(why)
    rows = cfg.row_layout_flush()
    if rows and cfg.flush_parts not in (None, 1):
        raise ValueError(f"flush_parts applies to the warp-layout flush pass (got {cfg.flush_parts} with a row layout)")
    parts = 1 if rows else (
        cfg.flush_parts if cfg.flush_parts is not None else default_flush_parts(shape.B, shape.HV, shape.L))
    if parts not in (1, 2, 4, 8):
        raise ValueError(f"flush_parts must be 1, 2, 4 or 8 (got {parts})")
    if not 0 <= cfg.flush_per_sm <= 32:
        raise ValueError(f"flush_per_sm must be 0..32 (got {cfg.flush_per_sm})")
    waves = -cfg.flush_per_sm if cfg.flush_per_sm else cfg.flush_waves
    lib = _lib(cfg)
    fp8 = read_copy_scales is not None
    sc = read_copy_scales if read_copy_scales is not None else initial_state
    strides = (*step.strides, read_copy.stride(0), sc.stride(0), v_cache.stride(0), beta_cache.stride(0))
    vp = ctypes.c_void_p
    st = (ctypes.c_int64 * 11)(*strides)
    ff = step.force_flush
    s = shape

    def launch(flush: bool) -> None:
        rc = lib.read_copy_launch(
            vp(step.qkv.data_ptr()), vp(step.a.data_ptr()), vp(step.b.data_ptr()), vp(step.A_log.data_ptr()),
            vp(step.dt_bias.data_ptr()), vp(out.data_ptr()), vp(initial_state.data_ptr()), vp(read_copy.data_ptr()),
            vp(sc.data_ptr()), vp(d_cache.data_ptr()), vp(k_cache.data_ptr()), vp(g_cache.data_ptr()),
            vp(v_cache.data_ptr()), vp(beta_cache.data_ptr()), vp(ssm_state_indices.data_ptr()),
            vp(write_pos.data_ptr()), vp(ff.data_ptr() if ff is not None else 0), ctypes.c_float(step.scale), st,
            ctypes.c_int(s.B), ctypes.c_int(s.H), ctypes.c_int(s.HV), ctypes.c_int(s.L), ctypes.c_int(int(is_kda)),
            ctypes.c_int(int(use_qk_l2norm_in_kernel)), ctypes.c_int(_IO[mixed_qkv.dtype]),
            ctypes.c_int(int(ssm_state_indices.dtype == torch.int64)), ctypes.c_int(2 if fp8 else 1),
            ctypes.c_int(int(flush)), ctypes.c_int(parts), ctypes.c_int(waves),
            vp(torch.cuda.current_stream(mixed_qkv.device).cuda_stream),
        )  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"read_copy_launch failed with cudaError {rc}")

    if cfg.overlap:
        main = torch.cuda.current_stream(mixed_qkv.device)
        side, fork, join = _side_stream(mixed_qkv.device, cfg.high_priority)
        fork.record(main)
        side.wait_event(fork)
        with torch.cuda.stream(side):
            launch(True)
        join.record(side)
        launch(False)
        main.wait_event(join)
    else:
        launch(True)
        launch(False)
    return out, initial_state


_SIDE: dict[tuple[int, bool], tuple[torch.cuda.Stream, torch.cuda.Event, torch.cuda.Event]] = {}


def _side_stream(device: torch.device, high: bool) -> tuple[torch.cuda.Stream, torch.cuda.Event, torch.cuda.Event]:
    """The flush pass's side stream of this device (high or default priority) with its fork and
    join events, created on first use and reused (as :func:`.ring_decode_cuda._side_stream`)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if (idx, high) not in _SIDE:
        prio = -100 if high else 0  # lower is higher; torch maps out-of-range values to the highest priority
        _SIDE[idx, high] = (torch.cuda.Stream(device=idx, priority=prio), torch.cuda.Event(), torch.cuda.Event())
    return _SIDE[idx, high]

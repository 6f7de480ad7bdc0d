"""Build, load and launch ``csrc/ring_read.cu``: the ring decode step's two passes in CUDA.

``flush=False``: the non-flush rows (output + ring record; padded rows zeroed; flush rows
skipped), the contract of :func:`sglang_replayssm.kernels.ring_decode_slices.ring_read_rows_kernel`.
``flush=True``: the flush rows (output + new checkpoint; every other row skipped), the contract of
the flush pass of :mod:`.ring_decode_triton`. :func:`run_passes` launches the two in that order
(or concurrently, on two streams). The shared object is compiled once per (source, architecture,
build options: register budgets, staging depth, bulk copies) with ``nvcc`` into
``$SGLANG_REPLAYSSM_CUDA_CACHE`` (default ``~/.cache/sglang-replayssm/cuda``) and loaded with
``ctypes``; the launch goes onto the current torch stream, so it is captured by CUDA graphs like
any other kernel. A build with ``fused`` > 0 also holds the one-launch kernel: both passes' work in
one grid (the flush rows' region dispatched first), each item run by its pass's code, so its
outputs are the two passes' bit for bit (``run_passes(..., fused=n)``). The bulk-copy builds, ``vsplit`` and the non-flush pass's grid cap (``waves``)
are research parameters of :func:`run_passes`, used only by the sweeps.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import subprocess
from pathlib import Path

import torch

from .. import settings
from .ring_decode_args import RingStep
from .ring_decode_config import RingDecodeConfig

__all__ = [
    "DEFAULT_BUILD", "DEFAULT_FUSED", "MAPPED_DEFAULT", "CudaReadUnsupported", "available", "build", "cache_dir",
    "launch_step", "nvcc_shared", "run_passes", "supports",
]  # fmt: skip

_SRC = Path(__file__).parent / "csrc" / "ring_read.cu"
_LOG = logging.getLogger("sglang_replayssm")
_LIBS: dict[tuple[str, int, int, int, int, bool, bool, int, bool], ctypes.CDLL] = {}
_IO = {torch.float32: 0, torch.bfloat16: 1}
STAGES = (0, 2, 3, 4)  # checkpoint staging depths a build may take (0: register double buffer)
VSPLITS = (1, 2, 4, 8)  # warps per (row, value head): each streams V / vsplit rows in 8-row chunks
#: the build pick_config's CUDA launch uses:
#: (min_blocks, flush_min_blocks, stages, flush_stages, bulk, flush_bulk)
DEFAULT_BUILD = (4, 1, 3, 3, False, False)
#: the step pick_config's CUDA launch takes: one launch (flush items first) built at a register budget of 3
#: blocks per SM; under the serving protocol it beat the two passes at every B for GDN and KDA with the
#: same outputs bit for bit (docs/BENCHMARKS.md, kernels under the serving protocol). 0: two launches.
DEFAULT_FUSED = 3
#: whether the default launch takes the CUDA passes' row-map build (``ring_map``) for a step whose rings are keyed
#: by request row: yes. Its GPU tests pass and, served at 256 concurrent on qnext-gdn-24 (H100), it decodes as fast
#: as the slot-keyed CUDA step (9.48 vs 9.53 ms a step, docs/BENCHMARKS.md); False keeps mapped steps on Triton.
MAPPED_DEFAULT = True


class CudaReadUnsupported(ValueError):
    """The inputs fall outside what ``ring_read.cu`` is compiled for (see :func:`supports`)."""


@functools.cache
def _arch_of(device: int) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}{minor}{'a' if (major, minor) == (9, 0) else ''}"


def _arch() -> str:
    return _arch_of(torch.cuda.current_device())


def cache_dir() -> Path:
    return settings.CUDA_CACHE.value()


def build(
    arch: str | None = None, min_blocks: int = 4, out_dir: Path | None = None, flush_min_blocks: int = 1,
    stages: int = 0, flush_stages: int = 0, bulk: bool = False, flush_bulk: bool = False, fused: int = 0,
    ring_map: bool = False,
) -> Path:
    """Compile ``ring_read.cu`` for ``arch`` (e.g. ``"90a"``) unless the cache holds it; return the .so.

    ``min_blocks`` / ``flush_min_blocks``: register budgets of the two passes, as blocks of 4 warps
    resident per SM (``__launch_bounds__``; 1 = no cap). ``stages`` / ``flush_stages`` (the two
    passes): 0 streams the checkpoint through two register buffers; 2..4 through a ``cp.async`` ring
    of that many chunks per warp in shared memory. ``bulk`` / ``flush_bulk`` (the two passes): a
    staged chunk's checkpoint rows arrive by one bulk copy (the sm_90 copy engine, completion on an
    mbarrier) instead of 8 ``cp.async`` per lane. ``fused``: 0 builds the two passes only; n >= 1 also
    the one-launch kernel, with a register budget of n blocks per SM for both kinds of items. ``ring_map``:
    the rings are read and written at ``ring_map[slot]`` (rings keyed by request row), not at the slot."""
    if stages not in STAGES or flush_stages not in STAGES:
        raise ValueError(f"stages and flush_stages must be in {STAGES} (got {stages}, {flush_stages})")
    arch = arch or _arch()
    if (bulk or flush_bulk) and int(arch.rstrip("a")) < 90:
        raise CudaReadUnsupported(f"bulk staging needs sm_90 or newer (got sm_{arch})")
    src = _SRC.read_bytes()
    opts = f"{arch}:{min_blocks}:{flush_min_blocks}:{stages}:{flush_stages}"
    opts += (":bulk" if bulk else "") + (":fbulk" if flush_bulk else "") + (f":fused{fused}" if fused else "")
    opts += ":map" if ring_map else ""
    key = hashlib.sha256(src + opts.encode()).hexdigest()[:16]
    out_dir = out_dir or cache_dir()
    # the name shows the options that differ from the plain build (the hash tells builds apart)
    suffix = "" if flush_min_blocks == 1 else f"_f{flush_min_blocks}"
    suffix += f"_s{stages}{flush_stages}" if stages or flush_stages else ""
    suffix += ("_b" if bulk else "") + ("_fb" if flush_bulk else "") + (f"_u{fused}" if fused else "")
    suffix += "_map" if ring_map else ""
    so = out_dir / f"ring_read_{arch}_{min_blocks}{suffix}_{key}.so"
    if so.exists():
        return so
    out_dir.mkdir(parents=True, exist_ok=True)
    _LOG.info("sglang-replayssm: building ring_read.cu for sm_%s into %s (once)", arch, out_dir)
    defines = [f"-DRR_MIN_BLOCKS={min_blocks}", f"-DRR_FLUSH_MIN_BLOCKS={flush_min_blocks}",
               f"-DRR_STAGES={stages}", f"-DRR_FLUSH_STAGES={flush_stages}", f"-DRR_BULK={int(bulk)}",
               f"-DRR_FLUSH_BULK={int(flush_bulk)}"]
    defines += ["-DRR_FUSED=1", f"-DRR_FUSED_MIN_BLOCKS={fused}"] if fused else []
    defines += ["-DRR_RING_MAP=1"] if ring_map else []
    return nvcc_shared(_SRC, so, arch, defines)


def nvcc_shared(src: Path, so: Path, arch: str, flags: list[str]) -> Path:
    """Compile ``src`` into the shared library ``so`` for ``sm_{arch}`` (atomically: a temporary file
    per process, then a rename); ``CudaReadUnsupported`` without nvcc, RuntimeError on its errors."""
    tmp = so.with_suffix(f".{os.getpid()}.tmp")
    cmd = [
        os.environ.get("NVCC", "nvcc"), f"-gencode=arch=compute_{arch},code=sm_{arch}", "-O3", "-std=c++17",
        "-shared", "-Xcompiler", "-fPIC", *flags, str(src), "-o", str(tmp),
    ]  # fmt: skip
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    except FileNotFoundError as e:
        raise CudaReadUnsupported(f"building {src.name} needs nvcc on PATH (or $NVCC)") from e
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"nvcc failed on {src.name}:\n{e.stderr[-2000:]}") from e
    tmp.replace(so)
    return so


_AVAILABLE: dict[str, bool] = {}


def available(ring_map: bool = False) -> bool:
    """Whether the CUDA passes can run here without an error: a CUDA device of compute capability
    8.0 or newer, ``SGLANG_REPLAYSSM_CUDA_KERNELS`` not ``0``, and the default build
    (:data:`DEFAULT_BUILD` with :data:`DEFAULT_FUSED`; ``ring_map``: its row-map twin) cached or nvcc able to
    make it (built and loaded on the first call; the answer is cached per process)."""
    if not settings.CUDA_KERNELS.value() or not torch.cuda.is_available():
        return False
    key = f"{torch.cuda.current_device()}{':map' if ring_map else ''}"
    if key not in _AVAILABLE:
        ok = torch.cuda.get_device_capability() >= (8, 0)
        if ok:
            try:
                _lib(*DEFAULT_BUILD, fused=DEFAULT_FUSED, ring_map=ring_map)
            except (CudaReadUnsupported, RuntimeError, OSError):
                ok = False
        _AVAILABLE[key] = ok
    return _AVAILABLE[key]


def _lib(
    min_blocks: int, flush_min_blocks: int = 1, stages: int = 0, flush_stages: int = 0, bulk: bool = False,
    flush_bulk: bool = False, fused: int = 0, ring_map: bool = False,
) -> ctypes.CDLL:
    """The loaded shared object for this device's architecture and these build options (:func:`build`);
    built (or found in the cache) and loaded once per process, so decode steps only pay a dict lookup."""
    key = (_arch(), min_blocks, flush_min_blocks, stages, flush_stages, bulk, flush_bulk, fused, ring_map)
    if key not in _LIBS:
        so = build(key[0], min_blocks, flush_min_blocks=flush_min_blocks, stages=stages, flush_stages=flush_stages,
                   bulk=bulk, flush_bulk=flush_bulk, fused=fused, ring_map=ring_map)  # fmt: skip
        lib = ctypes.CDLL(str(so))
        lib.ring_step_launch.restype = ctypes.c_int
        lib.ring_step_launch_fused.restype = ctypes.c_int
        _LIBS[key] = lib
    return _LIBS[key]


def supports(
    mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
    out: torch.Tensor, state: torch.Tensor, d: torch.Tensor, k: torch.Tensor, g: torch.Tensor,
    slots: torch.Tensor, K: int, V: int, L: int,
) -> str | None:  # fmt: skip
    """``None`` when ``ring_read.cu`` handles these inputs, else the reason it does not."""
    if not mixed_qkv.is_cuda:
        return "tensors are not on a CUDA device"
    if (K, V) != (128, 128) or L > 16:
        return f"compiled for K = V = 128 and L <= 16 (got K={K}, V={V}, L={L})"
    if mixed_qkv.dtype not in _IO or any(t.dtype != mixed_qkv.dtype for t in (a, b, out)):
        return "qkv, a, b and out must share one dtype, fp32 or bf16"
    if any(t.dtype != torch.float32 for t in (A_log, dt_bias, state, d, k, g)):
        return "A_log, dt_bias, the checkpoint and the ring must be fp32"
    if slots.dtype not in (torch.int32, torch.int64):
        return "ssm_state_indices must be int32 or int64"
    if not (A_log.is_contiguous() and dt_bias.is_contiguous()):
        return "A_log and dt_bias must be contiguous"
    return None


def launch_step(
    step: RingStep, *, flush: bool, warps: int, min_blocks: int, flush_min_blocks: int, stages: int,
    flush_stages: int, bulk: bool = False, flush_bulk: bool = False, vsplit: int = 1, waves: int = 0, tail: int = 0,
    fused: int = 0, flush_waves: int = 0,
) -> None:  # fmt: skip
    """Launch one pass for the step's ``B`` rows, ``vsplit`` warps per (row, value head) each
    streaming ``V / vsplit`` rows; ``waves`` > 0 caps the grid at that many resident sets of blocks
    (each warp then serves several (row, head) items, and rows the pass skips cost one short wave),
    0 launches one warp per item. ``tail`` > 0 (``vsplit`` 1): the last ``tail`` quarters of the
    resident warps' worth of items (but none of the first resident set's) are served in halves, so
    the step's ragged end is short. Precondition, checked once per step by the caller: the
    arguments passed :mod:`.ring_decode_args`'s checks and :func:`supports` returned ``None``.
    ``fused`` > 0: one launch of both passes' work instead (``flush`` ignored; ``waves`` / ``tail``
    the non-flush rows', ``flush_waves`` the flush rows') from the build with that register budget."""
    lib = _lib(min_blocks, flush_min_blocks, stages, flush_stages, bulk, flush_bulk, fused, step.ring_map is not None)
    s = step.shape
    vp = ctypes.c_void_p
    st = (ctypes.c_int64 * 7)(*step.strides)
    ff = step.force_flush
    fn, last = (lib.ring_step_launch_fused, flush_waves) if fused else (lib.ring_step_launch, int(flush))
    rc = fn(
        vp(step.qkv.data_ptr()), vp(step.a.data_ptr()), vp(step.b.data_ptr()), vp(step.A_log.data_ptr()),
        vp(step.dt_bias.data_ptr()), vp(step.out.data_ptr()), vp(step.state.data_ptr()), vp(step.d.data_ptr()),
        vp(step.k.data_ptr()), vp(step.g.data_ptr()), vp(step.slots.data_ptr()), vp(step.write_pos.data_ptr()),
        vp(ff.data_ptr() if ff is not None else 0), vp(step.ring_map_arg.data_ptr()), ctypes.c_float(step.scale), st,
        ctypes.c_int(s.B),
        ctypes.c_int(s.H), ctypes.c_int(s.HV), ctypes.c_int(s.L), ctypes.c_int(int(step.is_kda)),
        ctypes.c_int(int(step.use_l2norm)), ctypes.c_int(_IO[step.qkv.dtype]),
        ctypes.c_int(int(step.slots.dtype == torch.int64)), ctypes.c_int(warps), ctypes.c_int(vsplit),
        ctypes.c_int(waves), ctypes.c_int(tail), ctypes.c_int(last),
        vp(torch.cuda.current_stream(step.qkv.device).cuda_stream),
    )  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"ring_step_launch failed with cudaError {rc}")


_SIDE: dict[int, tuple[torch.cuda.Stream, torch.cuda.Event, torch.cuda.Event]] = {}


def _side_stream(device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Event, torch.cuda.Event]:
    """The flush pass's side stream of this device with its fork and join events, created on first
    use and reused (a wait binds to the event's latest record, so reuse is safe and a step
    allocates nothing)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SIDE:
        _SIDE[idx] = (torch.cuda.Stream(device=idx), torch.cuda.Event(), torch.cuda.Event())
    return _SIDE[idx]


def run_passes(
    step: RingStep, cfg: RingDecodeConfig, *, flush: bool = True, bulk: bool = False, flush_bulk: bool = False,
    vsplit: int = 1, waves: int = 0, fused: int | None = None,
) -> None:  # fmt: skip
    """The step's CUDA passes with ``cfg``'s ``cuda_*`` knobs: the non-flush pass, then (``flush``)
    the flush pass, or, with ``cfg.cuda_overlap``, the flush pass on a side stream forked from and
    joined back to the current one. The passes serve disjoint rows (distinct slots), so they
    overlap on the GPU (two parallel nodes when captured in a CUDA graph) and an empty pass costs
    no step time. ``flush=False`` leaves the flush rows to the caller; the other keywords are
    research parameters (see :func:`launch_step`). ``fused`` (None: ``cfg.cuda_fused``) > 0 with
    ``flush``: both passes' work in one launch (the build with that register budget; no side stream)."""
    fused = cfg.cuda_fused if fused is None else fused
    one_pass = functools.partial(
        launch_step, step, warps=cfg.cuda_warps, min_blocks=cfg.cuda_min_blocks,
        flush_min_blocks=cfg.cuda_flush_min_blocks, stages=cfg.cuda_stages, flush_stages=cfg.cuda_flush_stages,
        bulk=bulk, flush_bulk=flush_bulk, vsplit=vsplit,
    )  # fmt: skip
    if flush and fused:
        one_pass(flush=True, waves=waves, tail=cfg.cuda_tail, fused=fused, flush_waves=cfg.cuda_flush_waves)
        return
    if flush and cfg.cuda_overlap:
        main = torch.cuda.current_stream(step.qkv.device)
        side, fork, join = _side_stream(step.qkv.device)
        fork.record(main)
        side.wait_event(fork)
        with torch.cuda.stream(side):
            one_pass(flush=True, waves=cfg.cuda_flush_waves)
        join.record(side)
        one_pass(flush=False, waves=waves, tail=cfg.cuda_tail)
        main.wait_event(join)
        return
    one_pass(flush=False, waves=waves, tail=cfg.cuda_tail)
    if flush:
        one_pass(flush=True, waves=cfg.cuda_flush_waves)

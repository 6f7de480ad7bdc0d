"""The serving protocol of the decode-kernel benches: one decode step of a forward, every launch the product
makes for each layer, several layers interleaved in one captured CUDA graph.

An *arm* is one decode implementation (:data:`ARMS`). For an arm, a :class:`Stack` holds ``layers`` layers, each
with its own pool (checkpoints, ring, read copy) and inputs, allocated as SGLang allocates them (one
``[layers, slots, ...]`` tensor, layer ``i`` its ``[i]``), so nothing a layer reads stays in L2 for the next
unless it would in a forward. Rows ``r = 0..B-1`` sit on slots ``r + 1`` (slot 0: SGLang's padding slot).

* Cursors: slot ``r + 1`` starts at ``r mod L``; the device cursor step
  (:func:`sglang_replayssm.kernels.cursor.cursor_step`, once per step, shared by the layers, as the product's
  decode metadata, with a force-flush mask that never fires) advances it, so in step ``t`` row ``r`` is at
  cursor ``(r + t) mod L`` and every step flushes ``B / L`` rows. A window of ``L`` steps returns every cursor
  to its start, so a captured window replays the same work each time.
* A layer's step (after the cursor step), by arm: the fp32 ring :func:`~sglang_replayssm.kernels.ring_decode.
  ring_decode` (the product's default: the CUDA passes, flush and non-flush, where they build); the read copy
  :func:`sglang_replayssm.radix.read_copy.store.decode_step` (the stale refresh, then the flush and non-flush
  passes of :func:`~sglang_replayssm.kernels.read_copy_cuda.read_copy_decode_cuda`; the torch reference on
  CPU), with its ``d~`` / ``v`` records carved out of the fp32 ``d`` ring as the product does for a bf16 model;
  SGLang's ReplaySSM kernel (after the same cursor step); packed decodes (SGLang's, vLLM's): their kernel
  alone, no ring and no cursor.
* A *batch* is one replay of the captured window (``L`` steps x ``layers`` layers); per layer-step time =
  replay time / (``L * layers``).

Nothing here needs CUDA except :func:`replay_times`; the CPU tests drive :func:`window` at tiny shapes.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sglang_replayssm.kernels.cursor import cursor_step
from sglang_replayssm.kernels.read_copy_format import alloc_read_copy
from sglang_replayssm.radix.read_copy.store import ReadCopyLayer

__all__ = ["ARMS", "ArmSpec", "Shape", "Stack", "arm_step", "FUSED_MIN_BLOCKS", "replay_times", "ring_decode_fused", "stats", "window"]

#: the force-flush interval of the cursor step: with every ``seq_lens`` 1 the mask is built but never fires
TRACK_INTERVAL = 1 << 30


@dataclass(frozen=True)
class Shape:
    """One model's heads and dims, the batch ``B``, ring length ``L`` and the number of interleaved layers."""

    H: int
    HV: int
    K: int
    V: int
    is_kda: bool
    B: int
    L: int = 16
    layers: int = 4


@dataclass(frozen=True)
class ArmSpec:
    """An arm: its checkpoint dtype, ring dtype (None: a packed decode, no ring and no cursor step), read-copy
    format, which kernel, the models it applies to, and its name in the bytes model
    (:func:`tests.support.read_copy_bench.window_bytes`)."""

    state: torch.dtype
    ring: torch.dtype | None
    kernel: str
    floor: str
    copy: str | None = None
    models: tuple[str, ...] = ("gdn", "kda")


_F32, _BF16 = torch.float32, torch.bfloat16
#: in the order a run takes them (a run out of time loses the last); SGLang's KDA CUDA kernel takes an fp32
#: state only
ARMS: dict[str, ArmSpec] = {
    "ours_fp32": ArmSpec(_F32, _F32, "ours", "ours_fp32"),
    "copy_bf16": ArmSpec(_F32, _F32, "copy", "copy_bf16", copy="bf16"),
    "copy_fp8": ArmSpec(_F32, _F32, "copy", "copy_fp8", copy="fp8"),
    "sglang_packed_fp32": ArmSpec(_F32, None, "sglang_packed", "sglang_packed_fp32"),
    "vllm_packed_fp32": ArmSpec(_F32, None, "vllm_packed", "sglang_packed_fp32", models=("gdn",)),
    "sglang_packed_cuda_fp32": ArmSpec(_F32, None, "sglang_packed_cuda", "sglang_packed_fp32", models=("kda",)),
    "sglang_rs_bf16": ArmSpec(_BF16, _BF16, "sglang_rs", "sglang_rs_bf16"),
    "sglang_packed_bf16": ArmSpec(_BF16, None, "sglang_packed", "sglang_packed_bf16"),
    "sglang_rs_fp32": ArmSpec(_F32, _F32, "sglang_rs", "sglang_rs_fp32"),
    "vllm_packed_bf16": ArmSpec(_BF16, None, "vllm_packed", "sglang_packed_bf16", models=("gdn",)),
    "ours_fp32_fused": ArmSpec(_F32, _F32, "ours_fused", "ours_fp32"),
    "ours_fp32_fused3": ArmSpec(_F32, _F32, "ours_fused3", "ours_fp32"),
}

#: the one-launch arms' register budgets (blocks per SM; ``RingDecodeConfig.cuda_fused``), by kernel name
FUSED_MIN_BLOCKS = {"ring_decode_fused": 4, "ring_decode_fused3": 3}


def ring_decode_fused(min_blocks: int) -> Callable[..., None]:
    """``ring_decode`` (its positional arguments) with the default config, its CUDA passes in one launch
    (``cuda_fused=min_blocks``); where the default is not the CUDA passes, the default."""
    import dataclasses

    from sglang_replayssm.kernels.ring_decode import checked_step, default_config, launch

    def fn(*args: Any, use_qk_l2norm_in_kernel: bool, is_kda: bool) -> None:
        step = checked_step(*args, use_qk_l2norm_in_kernel, is_kda)  # type: ignore[call-arg]
        if step.shape.B == 0:
            return
        cfg = default_config(step)
        if cfg.engine == "cuda":
            cfg = dataclasses.replace(cfg, cuda_fused=min_blocks)
        launch(step, cfg)

    return fn


#: a stack's read copy: copy, fp8 scales (None for bf16), d~ and v records, beta, stale flags (layer dim first)
CopyBuffers = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class Stack:
    """``shape.layers`` layers of one arm's pools and inputs on ``device`` (module docstring).

    Per layer ``i`` (views of ``[layers, ...]`` tensors): ``qkv[i]`` ``[B, 2HK + HV V]``, ``a[i]`` ``[B, HV]``
    (KDA ``[B, HV, K]``), ``b[i]`` ``[B, HV]`` in ``io``; ``A_log[i]`` ``[HV]``, ``dt_bias[i]`` ``[HV]`` (KDA
    ``[HV, K]``) fp32; ``state[i]`` ``[B+1, HV, V, K]`` in ``spec.state``; with a ring ``d[i]`` ``[B+1, HV, L, V]``,
    ``k[i]`` ``[B+1, H, L, K]`` (L2-normalised) in ``spec.ring``, ``g[i]`` fp32; with a copy :meth:`copy_layer`.
    Shared by the layers: ``slots`` ``[B]``, the per-slot cursors ``write_pos`` ``[B+1]``, the step's snapshot
    ``wp`` and force-flush mask ``ff`` ``[B]`` (int32)."""

    def __init__(self, shape: Shape, spec: ArmSpec, device: str | torch.device, io: torch.dtype = _BF16,
                 seed: int = 0) -> None:  # fmt: skip
        s, nl, n = shape, shape.layers, shape.B + 1
        self.shape, self.spec, self.io = s, spec, io
        gen = torch.Generator(device=device).manual_seed(seed)

        def rnd(*dims: int, scale: float = 1.0, dtype: torch.dtype = _F32) -> torch.Tensor:
            return (torch.randn(dims, generator=gen, device=device) * scale).to(dtype)

        kv = (s.K,) if s.is_kda else ()
        self.qkv = rnd(nl, s.B, 2 * s.H * s.K + s.HV * s.V, dtype=io)
        self.a = rnd(nl, s.B, s.HV, *kv, dtype=io)
        self.b = rnd(nl, s.B, s.HV, dtype=io)
        self.A_log = torch.rand(nl, s.HV, generator=gen, device=device) * 0.5 - 0.5
        self.dt_bias = rnd(nl, s.HV, *kv, scale=0.3)
        self.scale = s.K**-0.5
        self.state = rnd(nl, n, s.HV, s.V, s.K, scale=0.01, dtype=spec.state)
        self.out = torch.zeros(nl, s.B, 1, s.HV, s.V, dtype=io, device=device)
        self.slots = torch.arange(1, s.B + 1, dtype=torch.int32, device=device)
        self.write_pos = torch.tensor([0] + [r % s.L for r in range(s.B)], dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(s.B, dtype=torch.int32, device=device)
        self.wp = torch.zeros(s.B, dtype=torch.int32, device=device)
        self.ff = torch.zeros(s.B, dtype=torch.int32, device=device)
        self.copy: CopyBuffers | None = None
        if spec.ring is None:
            return
        self.d = rnd(nl, n, s.HV, s.L, s.V, scale=0.01, dtype=spec.ring)
        k = torch.randn(nl, n, s.H, s.L, s.K, generator=gen, device=device)
        self.k = torch.nn.functional.normalize(k, dim=-1).to(spec.ring)
        self.g = -torch.rand((nl, n, s.HV, s.L, *kv), generator=gen, device=device) * 0.1
        if spec.copy is None:
            return
        copy, scales = alloc_read_copy(nl * n, s.HV, s.V, s.K, spec.copy, s.is_kda, device)  # type: ignore[arg-type]
        rec = (nl, n, s.HV, s.L, s.V)
        if spec.ring == _F32 and io.itemsize == 2:  # carved out of the fp32 d ring, as the product's store does
            pair = self.d.view(io).view(nl, n, 2, s.HV, s.L, s.V)
            d_rec, v_rec = pair[:, :, 0], pair[:, :, 1]
        else:
            d_rec, v_rec = torch.empty(rec, dtype=io, device=device), torch.empty(rec, dtype=io, device=device)
        d_rec.copy_(rnd(*rec, scale=0.01))
        v_rec.copy_(rnd(*rec))
        beta = torch.rand(rec[:-1], generator=gen, device=device)
        stale = torch.ones(nl, n, dtype=torch.bool, device=device)  # the first step's refresh writes every copy
        self.copy = (copy.view(nl, n, s.HV, s.V, s.K), None if scales is None else scales.view(nl, n, s.HV, s.V),
                     d_rec, v_rec, beta, stale)  # fmt: skip

    def copy_layer(self, i: int) -> ReadCopyLayer:
        """Layer ``i``'s read copy as the product's store hands it to the decode step."""
        assert self.copy is not None
        c, sc, d, v, beta, stale = self.copy
        return ReadCopyLayer(c[i], None if sc is None else sc[i], d[i], v[i], beta[i], stale[i])

    def cursor(self) -> None:
        """The step's cursor snapshot, force-flush mask and advance (the product's decode metadata)."""
        cursor_step(self.write_pos, self.slots, self.shape.L, seq_lens=self.seq_lens, track_interval=TRACK_INTERVAL,
                    wp_out=self.wp, ff_out=self.ff)  # fmt: skip


def arm_step(stack: Stack, kernels: dict[str, Callable[..., Any]]) -> Callable[[int], None]:
    """The launches of one layer's decode step of ``stack``'s arm (after the step's cursor step), as a function
    of the layer index. ``kernels``: ``ring_decode`` and ``read_copy_decode`` (ours; the copy's decode the
    store calls), ``ring_decode_fused`` / ``ring_decode_fused3`` (:func:`ring_decode_fused`), ``sglang_rs``, ``sglang_packed`` (GDN or KDA Triton), ``sglang_packed_cuda`` (KDA),
    ``vllm_packed`` as the arm needs, each with its owner's signature."""
    st, s, kind = stack, stack.shape, stack.spec.kernel
    B = s.B
    if kind.startswith("ours"):
        fn = kernels["ring_decode" + kind[4:]]
        return lambda i: fn(st.qkv[i], st.a[i], st.b[i], st.A_log[i], st.dt_bias[i], st.scale, st.state[i], st.d[i],
                            st.k[i], st.g[i], st.out[i], st.slots, st.wp, st.ff, use_qk_l2norm_in_kernel=True,
                            is_kda=s.is_kda)  # fmt: skip
    if kind == "copy":
        from sglang_replayssm.radix.read_copy.store import decode_step

        fn = kernels["read_copy_decode"]
        layers = [st.copy_layer(i) for i in range(s.layers)]
        return lambda i: decode_step(fn, layers[i], st.qkv[i], st.a[i], st.b[i], st.A_log[i], st.dt_bias[i],
                                     st.scale, st.state[i], st.k[i], st.g[i], st.out[i], st.slots, st.wp, st.ff,
                                     s.is_kda)  # fmt: skip
    if kind == "sglang_rs":
        fn = kernels["sglang_rs"]
        return lambda i: fn(st.qkv[i], st.a[i], st.b[i], st.A_log[i], st.dt_bias[i], st.scale, st.state[i], st.d[i],
                            st.k[i], st.g[i], st.out[i], st.slots, st.wp, st.ff, use_qk_l2norm_in_kernel=True,
                            is_kda=s.is_kda)  # fmt: skip
    fn = kernels[kind]
    if kind == "sglang_packed_cuda":
        return lambda i: fn(st.qkv[i], st.a[i].reshape(B, -1), st.b[i], st.A_log[i], st.dt_bias[i].reshape(-1),
                            st.scale, st.state[i], st.out[i], st.slots, s.H)  # fmt: skip
    if s.is_kda:  # SGLang's KDA packed decode takes a [B, HV*K] and dt_bias [HV*K]
        return lambda i: fn(st.qkv[i], st.a[i].reshape(B, -1), st.b[i], st.A_log[i], st.dt_bias[i].reshape(-1),
                            st.scale, st.state[i], st.out[i], st.slots, use_qk_l2norm_in_kernel=True)  # fmt: skip
    return lambda i: fn(st.qkv[i], st.a[i], st.b[i], st.A_log[i], st.dt_bias[i], st.scale, st.state[i], st.out[i],
                        st.slots, use_qk_l2norm_in_kernel=True)  # fmt: skip


def window(stack: Stack, step: Callable[[int], None], layers: list[int] | None = None) -> Callable[[], None]:
    """One ring window: ``L`` steps, each the cursor step (ring arms) then ``step(i)`` for every layer in order
    (``layers``: a subset, e.g. ``[0]`` for the single-layer column)."""
    order = list(range(stack.shape.layers)) if layers is None else layers
    ring = stack.spec.ring is not None

    def run() -> None:
        for _ in range(stack.shape.L):
            if ring:
                stack.cursor()
            for i in order:
                step(i)

    return run


def replay_times(run: Callable[[], None], samples: int, warm: int = 2) -> tuple[list[float], str]:
    """Microseconds of each of ``samples`` back-to-back replays of ``run`` captured in one CUDA graph (after one
    eager call on a side stream: compiles, the copy's first refresh, and ``warm`` replays); eager calls if
    capture fails (the method says which)."""
    cur, side = torch.cuda.current_stream(), torch.cuda.Stream()
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        run()
    cur.wait_stream(side)
    torch.cuda.synchronize()
    method, call = "graph", run
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            run()
        call = graph.replay
    except Exception:
        torch.cuda.synchronize()
        method = "eager"
    for _ in range(warm):
        call()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(samples)]
    for e0, e1 in ev:
        e0.record()
        call()
        e1.record()
    torch.cuda.synchronize()
    return [e0.elapsed_time(e1) * 1000.0 for e0, e1 in ev], method


def stats(us: list[float], per: int) -> dict[str, float]:
    """Median, p90 (nearest rank), min and max of ``us`` divided by ``per``, and p90 / median."""
    xs = sorted(x / per for x in us)
    med = statistics.median(xs)
    p90 = xs[min(len(xs) - 1, max(0, -(-9 * len(xs) // 10) - 1))]
    return {"median": med, "p90": p90, "min": xs[0], "max": xs[-1], "p90_over_median": p90 / med, "n": len(xs)}

"""Ring decode kernels (sglang_replayssm.kernels.ring_decode, every engine) vs the fp64 recurrence.

Each test drives a batch through >= 2L+1 decode steps with the device cursor of
``sglang_replayssm.kernels.cursor``: random start cursors per slot, natural (``m == L-1``) and
forced flushes, padded rows (slot -1) and slots outside the batch. Invariants checked every step:

* the output of every valid row equals the fp64 gated-delta-rule step on the true state;
* padded rows output exactly zero; every output element is written (out is NaN-poisoned);
* the ring representation is exact: ``fold(temporal[slot], ring[slot], cursor[slot])`` equals the
  true state (at a flush the cursor is 0, so this is the flushed checkpoint itself);
* ring entries at or past the cursor are never read (they hold NaN);
* slots outside the batch (and their rings/cursors) are bit-for-bit untouched.

On CPU the kernels run under ``TRITON_INTERPRET=1`` with small shapes (K=V=32, L=4); on CUDA they
run compiled at the Qwen3-Next (GDN) and Kimi-Linear (KDA) shapes with L=16, over every launch
variant: the product's default through ``ring_decode``, the others (sweep dicts, research knobs
included) through ``lab.kernels.ring_decode_research``. fp32 I/O must agree to 1e-5 relative
error; bf16 I/O (production dtypes) to 5e-3.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lab.kernels.ring_decode_research import ring_decode_research
from sglang_replayssm.kernels import naive
from sglang_replayssm.kernels.cursor import cursor_step_torch
from sglang_replayssm.kernels.ring_decode import RingDecodeConfig, checked_step, pick_config, ring_decode
from sglang_replayssm.kernels.ring_decode_ref import ring_decode_torch

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


@dataclasses.dataclass(frozen=True)
class Shape:
    H: int
    HV: int
    K: int
    V: int
    L: int
    B: int  # rows, including padded ones
    slots: int


if CUDA:
    GDN = Shape(H=16, HV=32, K=128, V=128, L=16, B=10, slots=14)
    KDA = Shape(H=32, HV=32, K=128, V=128, L=16, B=10, slots=14)
else:
    GDN = Shape(H=2, HV=4, K=32, V=32, L=4, B=4, slots=6)
    KDA = Shape(H=2, HV=2, K=32, V=32, L=4, B=4, slots=6)


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-30))


class RingSim:
    """Pool + ring + cursors on DEV, and the fp64 truth per slot."""

    def __init__(self, shape: Shape, is_kda: bool, io_dtype: torch.dtype, seed: int) -> None:
        s = shape
        self.s, self.is_kda, self.io_dtype = s, is_kda, io_dtype
        self.gen = torch.Generator().manual_seed(seed)
        g = self.gen
        self.state = (torch.randn(s.slots, s.HV, s.V, s.K, generator=g) * 0.05).to(DEV)
        self.d = torch.randn(s.slots, s.HV, s.L, s.V, generator=g).to(DEV) * 0.1
        self.k = naive.l2norm_fp64(torch.randn(s.slots, s.H, s.L, s.K, generator=g)).float().to(DEV)
        gshape = (s.slots, s.HV, s.L, s.K) if is_kda else (s.slots, s.HV, s.L)
        self.g = (-torch.rand(gshape, generator=g) * 0.3).to(DEV)
        self.cursor = torch.randint(0, s.L, (s.slots,), generator=g, dtype=torch.int32).to(DEV)
        # rows: distinct slots, two padded rows, the rest of the slots stay outside the batch
        perm = torch.randperm(s.slots, generator=g)[: s.B].to(torch.int32)
        perm[1] = -1
        perm[-1] = -1
        self.rows = perm.to(DEV)
        self.outside = sorted(set(range(s.slots)) - set(perm.tolist()))
        # poison ring entries at/after the cursor: the kernel must never read them
        for slot in range(s.slots):
            c = int(self.cursor[slot])
            self.d[slot, :, c:] = float("nan")
            self.k[slot, :, c:] = float("nan")
            self.g[slot, :, c:] = float("nan")
        self.truth = {slot: self._fold(slot) for slot in range(s.slots)}
        self.A_log = (torch.rand(s.HV, generator=g) * 0.5 - 0.5).to(DEV)
        dt_shape = (s.HV, s.K) if is_kda else (s.HV,)
        self.dt_bias = (torch.randn(dt_shape, generator=g) * 0.3).to(DEV)
        self.flushes = {"natural": 0, "forced": 0}

    def _fold(self, slot: int) -> torch.Tensor:
        c = int(self.cursor[slot])
        return naive.fold_records_fp64(
            self.state[slot], self.d[slot], self.k[slot], self.g[slot], c, self.is_kda
        )

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s, g = self.s, self.gen
        qkv = torch.randn(s.B, 2 * s.H * s.K + s.HV * s.V, generator=g)
        a = torch.randn((s.B, s.HV, s.K) if self.is_kda else (s.B, s.HV), generator=g)
        b = torch.randn(s.B, s.HV, generator=g)
        return (qkv.to(self.io_dtype).to(DEV), a.to(self.io_dtype).to(DEV), b.to(self.io_dtype).to(DEV))

    def step(self, kernel_kwargs: dict, force_p: float, tol: float, force_row0: bool = False) -> None:
        s = self.s
        qkv, a, b = self.inputs()
        ff = (torch.rand(s.B, generator=self.gen) < force_p).to(torch.int32)
        ff[: s.B // 2] = 0  # the first half of the rows only flushes naturally (and row 0 when forced below)
        if force_row0:
            ff[0] = 1  # row 0 is never padding
        ff = ff.to(DEV)
        rows = self.rows
        safe = rows.clamp(min=0).long()
        wp = self.cursor[safe].clone()
        out = torch.full((s.B, 1, s.HV, s.V), float("nan"), dtype=self.io_dtype, device=DEV)
        before_outside = [
            (self.state[o].clone(), self.d[o].clone(), self.k[o].clone(), self.g[o].clone(), int(self.cursor[o]))
            for o in self.outside
        ]
        args = (qkv, a, b, self.A_log, self.dt_bias, s.K**-0.5, self.state, self.d, self.k, self.g, out, rows, wp, ff)
        if kernel_kwargs:
            ring_decode_research(*args, use_qk_l2norm_in_kernel=True, is_kda=self.is_kda, tuning=kernel_kwargs)
        else:
            ring_decode(*args, use_qk_l2norm_in_kernel=True, is_kda=self.is_kda)
        # Truth for the valid rows.
        valid = [i for i in range(s.B) if int(rows[i]) >= 0]
        vslots = [int(rows[i]) for i in valid]
        S = torch.stack([self.truth[sl] for sl in vslots])
        q, k, v = naive.unpack_mixed_qkv(qkv[valid], s.H, s.K, s.HV, s.V)
        gcur = naive.compute_gate_fp64(a[valid], self.A_log, self.dt_bias, is_kda=self.is_kda)
        beta = naive.compute_beta_fp64(b[valid])
        o_ref, S_new = naive.recurrent_step_fp64(S, q, k, v, gcur, beta, scale=s.K**-0.5)
        assert not torch.isnan(out).any(), "some output element was not written"
        assert _rel(out[valid, 0], o_ref) <= tol
        for i in range(s.B):
            if int(rows[i]) < 0:
                assert torch.count_nonzero(out[i]) == 0
        # Device cursor advance, then the exact-representation invariant.
        for i in valid:
            if int(wp[i]) == s.L - 1:
                self.flushes["natural"] += 1
            elif int(ff[i]):
                self.flushes["forced"] += 1
        # the force-flush mask is given directly here: seq_len % 1 == 0 would flush all rows
        seq = torch.where(ff != 0, 2, 1).to(DEV)
        cursor_step_torch(self.cursor, rows, s.L, seq_lens=seq, track_interval=2)
        for j, sl in enumerate(vslots):
            self.truth[sl] = S_new[j]
            got = self._fold(sl)
            assert _rel(got, S_new[j]) <= tol, f"slot {sl}: ring + checkpoint drifted from the recurrence"
        for o, (st, d, kk, g, c) in zip(self.outside, before_outside):
            assert torch.equal(self.state[o], st) and int(self.cursor[o]) == c
            assert torch.equal(d, self.d[o]) or torch.equal(d.isnan(), self.d[o].isnan())
            assert torch.equal(kk.nan_to_num(7.0), self.k[o].nan_to_num(7.0))
            assert torch.equal(g.nan_to_num(7.0), self.g[o].nan_to_num(7.0))
            assert torch.equal(d.nan_to_num(7.0), self.d[o].nan_to_num(7.0))


def _run(shape: Shape, is_kda: bool, kernel_kwargs: dict, io_dtype: torch.dtype, tol: float, seed: int) -> None:
    sim = RingSim(shape, is_kda, io_dtype, seed)
    for t in range(2 * shape.L + 1):
        # steps 1 and 2 force row 0: at step 2 its cursor is 0 < L-1, so that flush is a forced one;
        # rows 0 .. B/2-1 see no other forced flush, so each reaches L-1 within 2L+1 steps
        sim.step(kernel_kwargs, force_p=0.3, tol=tol, force_row0=t in (1, 2))
    assert sim.flushes["natural"] > 0 and sim.flushes["forced"] > 0, sim.flushes


if CUDA:
    VARIANTS = [
        {},  # pick_config defaults
        {"block_v": 16, "v_split": 1, "flush_mode": "fma", "prefetch": 1, "split": False},
        {"block_v": 16, "v_split": 1, "flush_mode": "fma", "prefetch": 2, "split": True},
        {"block_v": 32, "v_split": 2, "flush_mode": "fma", "prefetch": 2, "num_warps": 8},
        {"block_v": 8, "v_split": 8, "flush_mode": "fma", "num_warps": 2, "split": False},
        {"block_v": 16, "v_split": 4, "flush_mode": "ieee", "split": True},
        {"block_v": 64, "v_split": 1, "flush_mode": "fma", "num_warps": 8},
        {"block_v": 8, "num_warps": 1, "prefetch": 1, "split": True, "flush_block_v": 32, "flush_num_warps": 4},
        {"block_v": 8, "num_warps": 1, "prefetch": 2, "split": True, "row_major": True, "flush_mode": "ieee"},
        {"engine": "slices", "slice_k": 16, "block_v": 8, "num_warps": 1, "num_stages": 1, "flush_block_v": 8,
         "prefetch": 1, "row_major": True},
        {"engine": "slices", "slice_k": 32, "block_v": 32, "v_split": 1, "num_warps": 4, "num_stages": 3,
         "perm_rows": True, "flush_block_v": 16, "flush_num_warps": 2},
        {"engine": "slices", "slice_k": 16, "block_v": 16, "v_split": 1, "num_warps": 2, "num_stages": 3,
         "slices_first": True, "flush_block_v": 8},
        {"engine": "cuda", "block_v": 8, "num_warps": 1, "prefetch": 1, "row_major": True, "cuda_flush": False},
        {"engine": "cuda", "cuda_warps": 1, "cuda_min_blocks": 3, "block_v": 16, "flush_mode": "tf32x3",
         "cuda_flush": False},
        {"engine": "cuda"},
        {"engine": "cuda", "cuda_warps": 2, "cuda_min_blocks": 3},
        {"engine": "cuda", "cuda_stages": 2, "cuda_flush_stages": 2},
        {"engine": "cuda", "cuda_stages": 3, "cuda_flush_stages": 3, "cuda_vsplit": 2},
        {"engine": "cuda", "cuda_flush_stages": 2, "cuda_warps": 4, "cuda_vsplit": 4},
        {"engine": "cuda", "cuda_warps": 1, "cuda_vsplit": 8},
        {"engine": "cuda", "cuda_flush_stages": 2, "cuda_flush_min_blocks": 3},
        {"engine": "cuda", "cuda_stages": 3, "cuda_flush_stages": 3, "cuda_flush_waves": 1, "cuda_overlap": True},
        {"engine": "cuda", "cuda_stages": 3, "cuda_flush_stages": 3, "cuda_bulk": True, "cuda_flush_bulk": True},
        {"engine": "cuda", "cuda_stages": 2, "cuda_flush_stages": 4, "cuda_bulk": True, "cuda_flush_bulk": True,
         "cuda_vsplit": 2},
        {"engine": "cuda", "cuda_stages": 3, "cuda_flush_stages": 3, "cuda_tail": 4},
    ]
    TF32X3 = [{"block_v": 16, "v_split": 1, "flush_mode": "tf32x3"}]
else:
    VARIANTS = [
        {"block_v": 8, "v_split": 2, "flush_mode": "fma", "prefetch": 2, "split": True, "flush_block_v": 16},
        {"block_v": 16, "v_split": 1, "flush_mode": "ieee", "prefetch": 1, "split": False, "row_major": True},
        {"engine": "slices", "slice_k": 8, "block_v": 8, "num_warps": 1, "num_stages": 2, "perm_rows": False},
    ]
    TF32X3 = []


def _variants(is_kda: bool) -> list[dict]:
    return VARIANTS


@pytest.mark.interpret
@pytest.mark.parametrize("is_kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("vidx", range(len(VARIANTS)))
def test_fp32_matches_recurrence(is_kda: bool, vidx: int) -> None:
    variants = _variants(is_kda)
    if vidx >= len(variants):
        pytest.skip("variant not applicable")
    _run(KDA if is_kda else GDN, is_kda, variants[vidx], torch.float32, 1e-5, seed=11 + vidx)


#: pick_config's launch at serving batch sizes (B >= 16), forced here since the test batch is small
SERVING_KDA = {"engine": "slices", "slice_k": 32, "block_v": 8, "num_warps": 1, "flush_block_v": 8,
               "flush_num_warps": 1, "row_major": True, "prefetch": 1}  # fmt: skip
CUDA_READ = {"engine": "cuda"}


@pytest.mark.skipif(not CUDA, reason="bf16 I/O and tf32x3 are checked on the GPU only")
@pytest.mark.parametrize("kw", [{}, SERVING_KDA, CUDA_READ], ids=["default", "serving-kda", "cuda-read"])
@pytest.mark.parametrize("is_kda", [False, True], ids=["gdn", "kda"])
def test_bf16_io_matches_recurrence(is_kda: bool, kw: dict) -> None:
    _run(KDA if is_kda else GDN, is_kda, kw, torch.bfloat16, 5e-3, seed=3)


@pytest.mark.skipif(not CUDA, reason="only GPU batch sizes give a CUDA-pass warp several (row, head) items")
@pytest.mark.parametrize(
    "kw",
    [
        {"engine": "cuda", "cuda_waves": 1, "cuda_flush_waves": 1},
        {"engine": "cuda", "cuda_stages": 2, "cuda_flush_stages": 2, "cuda_vsplit": 2, "cuda_waves": 1,
         "cuda_flush_waves": 2},
        {"engine": "cuda", "cuda_waves": 1, "cuda_flush_waves": 1, "cuda_overlap": True},
        {"engine": "cuda", "cuda_stages": 3, "cuda_flush_stages": 3, "cuda_bulk": True, "cuda_flush_bulk": True,
         "cuda_waves": 1, "cuda_flush_waves": 1},
        {"engine": "cuda", "cuda_stages": 3, "cuda_flush_stages": 3, "cuda_tail": 2, "cuda_overlap": True},
    ],
    ids=["regs", "staged-vsplit2", "overlap", "bulk", "tail"],
)
@pytest.mark.parametrize("is_kda", [False, True], ids=["gdn", "kda"])
def test_cuda_passes_serve_several_items_per_warp(is_kda: bool, kw: dict) -> None:
    """With the grid capped at the resident warps (``cuda_waves``), B=80 (2,560+ items against ~2,100
    resident warps, ~1,000 for the flush pass) gives warps several items each, picked by ballot."""
    shape = dataclasses.replace(KDA if is_kda else GDN, B=80, slots=84)
    _run(shape, is_kda, kw, torch.float32, 1e-5, seed=17)


@pytest.mark.skipif(not TF32X3, reason="tf32x3 is a GPU variant")
@pytest.mark.parametrize("is_kda", [False, True], ids=["gdn", "kda"])
def test_tf32x3_flush_precision(is_kda: bool) -> None:
    """3xTF32 tensor-core flush: held to the same 1e-5 as the IEEE paths."""
    _run(KDA if is_kda else GDN, is_kda, TF32X3[0], torch.float32, 1e-5, seed=5)


def test_rejects_bad_inputs() -> None:
    s = GDN
    qkv = torch.zeros(2, 2 * s.H * s.K + s.HV * s.V, device=DEV)
    state = torch.zeros(3, s.HV, s.V, s.K, device=DEV)
    d = torch.zeros(3, s.HV, s.L, s.V, device=DEV)
    k = torch.zeros(3, s.H, s.L, s.K, device=DEV)
    g = torch.zeros(3, s.HV, s.L, device=DEV)
    out = torch.zeros(2, 1, s.HV, s.V, device=DEV)
    a = torch.zeros(2, s.HV, device=DEV)
    idx = torch.zeros(2, dtype=torch.int32, device=DEV)
    args = (qkv, a, a, torch.zeros(s.HV, device=DEV), torch.zeros(s.HV, device=DEV), 1.0, state, d, k)
    with pytest.raises(ValueError, match="write_pos"):
        ring_decode(*args, g, out, idx, idx.long())
    with pytest.raises(ValueError, match="g_cache"):
        ring_decode(*args, g.double(), out, idx, idx)
    with pytest.raises(ValueError, match="KDA `a`"):
        g_kda = torch.zeros(3, s.HV, s.L, s.K, device=DEV)
        ring_decode(*args, g_kda, out, idx, idx, is_kda=True)
    with pytest.raises(ValueError, match="block_v"):
        ring_decode(*args, g, out, idx, idx, config=RingDecodeConfig(3, 1, 1, 1, False))
    with pytest.raises(ValueError, match="block_v"):
        ring_decode(*args, g, out, idx, idx, config=RingDecodeConfig(s.V, 2, 1, 1, False))
    with pytest.raises(ValueError, match="engine"):
        RingDecodeConfig(8, 1, 1, 1, False, engine="tensor-cores")
    with pytest.raises(ValueError, match="unknown launch knob"):
        ring_decode_research(*args, g, out, idx, idx, tuning={"nk": 2})
    if not CUDA:
        with pytest.raises(ValueError, match="not on a CUDA device"):
            ring_decode(*args, g, out, idx, idx, config=RingDecodeConfig(8, 1, 1, 1, True, engine="cuda"))
    # B == 0 is a no-op
    empty = qkv[:0]
    ring_decode(empty, a[:0], a[:0], *args[3:], g, out[:0], idx[:0], idx[:0])


@pytest.mark.parametrize("kernel", [ring_decode, ring_decode_torch], ids=["fused", "torch"])
def test_cursor_tensors_have_exactly_b_entries(kernel) -> None:
    """``write_pos``, ``ssm_state_indices`` and ``force_flush`` have exactly B entries, as SGLang's
    wrapper requires and its decode metadata passes them: one validator for both paths."""
    s = GDN
    B = 2
    qkv = torch.zeros(B, 2 * s.H * s.K + s.HV * s.V, device=DEV)
    state = torch.zeros(3, s.HV, s.V, s.K, device=DEV)
    ring = (torch.zeros(3, s.HV, s.L, s.V, device=DEV), torch.zeros(3, s.H, s.L, s.K, device=DEV),
            torch.zeros(3, s.HV, s.L, device=DEV))  # fmt: skip
    a = torch.zeros(B, s.HV, device=DEV)
    args = (qkv, a, a, torch.zeros(s.HV, device=DEV), torch.zeros(s.HV, device=DEV), 1.0, state, *ring)
    out = torch.zeros(B, 1, s.HV, s.V, device=DEV)
    idx = torch.zeros(B, dtype=torch.int32, device=DEV)
    longer = torch.zeros(B + 1, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="write_pos"):
        kernel(*args, out, idx, longer)
    with pytest.raises(ValueError, match="ssm_state_indices"):
        kernel(*args, out, longer, idx)
    with pytest.raises(ValueError, match="force_flush"):
        kernel(*args, out, idx, idx, longer)


@pytest.mark.skipif(CUDA, reason="checks the CPU answer")
def test_cuda_passes_not_chosen_without_cuda() -> None:
    from sglang_replayssm.kernels.ring_decode_cuda import available

    assert not available()
    assert pick_config(256, 16, 32, 128, 128, 16, is_kda=False).engine == "regs"
    assert pick_config(256, 32, 32, 128, 128, 16, is_kda=True).engine == "slices"
    assert pick_config(256, 16, 32, 128, 128, 16, is_kda=False, cuda=True).engine == "cuda"
    assert pick_config(256, 16, 32, 64, 128, 16, is_kda=False, cuda=True).engine == "regs"  # K != 128
    assert pick_config(1, 16, 32, 128, 128, 16, is_kda=False, cuda=True).engine == "regs"  # B < 16


def _sglang_kernel():
    try:
        from tests.support.sglang_triton import sglang_replayssm_decode

        return sglang_replayssm_decode()
    except Exception:  # pragma: no cover - SGLang absent (the GPU box carries no install)
        return None


@pytest.mark.interpret
@pytest.mark.parametrize("is_kda", [False, True], ids=["gdn", "kda"])
def test_same_ring_effects_as_sglang_kernel(is_kda: bool) -> None:
    """One step from the same pool through ours and SGLang's kernel: same output, same ring/state writes.

    SGLang's kernel rounds its reconstruction operands to the output dtype (fp32 here, and
    interpreted on CPU its tl.dot is plain fp32), so the two agree to fp32 rounding.
    """
    fn = _sglang_kernel()
    if fn is None or CUDA:
        pytest.skip("SGLang's kernel is compared under the interpreter on CPU only")
    shape = KDA if is_kda else GDN
    sim = RingSim(shape, is_kda, torch.float32, seed=21)
    for t in (sim.d, sim.k, sim.g):
        t.nan_to_num_(0.0)  # SGLang's reconstruction multiplies masked zeros with loaded values
    qkv, a, b = sim.inputs()
    ff = torch.tensor([0, 0, 1, 0][: shape.B], dtype=torch.int32)
    wp = sim.cursor[sim.rows.clamp(min=0).long()].clone()
    res = []
    for kernel in (ring_decode, fn):
        st, d, k, g = sim.state.clone(), sim.d.clone(), sim.k.clone(), sim.g.clone()
        out = torch.full((shape.B, 1, shape.HV, shape.V), float("nan"))
        kernel(
            qkv, a, b, sim.A_log, sim.dt_bias, shape.K**-0.5, st, d, k, g, out, sim.rows, wp, ff,
            use_qk_l2norm_in_kernel=True, is_kda=is_kda,
        )  # fmt: skip
        res.append((out, st, d, k, g))
    for x, y in zip(res[0], res[1]):
        assert _rel(x, y.double()) <= 1e-5


@pytest.mark.interpret
@pytest.mark.parametrize("is_kda", [False, True])
def test_bf16_gate_parameters_are_widened_exactly(is_kda: bool) -> None:
    """SGLang keeps ``dt_bias`` in the served dtype (bf16); the step widens it (and A_log) to fp32 so the
    CUDA passes, which take fp32 only, can run, and the results equal those of the fp32 values."""
    s = KDA if is_kda else GDN
    runs = []
    for narrow in (False, True):
        sim = RingSim(s, is_kda, torch.float32, seed=5)
        sim.dt_bias = sim.dt_bias.to(torch.bfloat16)
        sim.A_log = sim.A_log.to(torch.bfloat16)
        if not narrow:
            sim.dt_bias, sim.A_log = sim.dt_bias.float(), sim.A_log.float()
        qkv, a, b = sim.inputs()
        out = torch.zeros(s.B, 1, s.HV, s.V, device=DEV)
        wp = sim.cursor[sim.rows.clamp(min=0).long()].clone()
        args = (qkv, a, b, sim.A_log, sim.dt_bias, s.K**-0.5, sim.state, sim.d, sim.k, sim.g, out, sim.rows, wp, None)
        step = checked_step(*args, use_qk_l2norm_in_kernel=True, is_kda=is_kda)
        assert step.dt_bias.dtype == torch.float32 and step.A_log.dtype == torch.float32
        assert torch.equal(step.dt_bias, sim.dt_bias.float()) and torch.equal(step.A_log, sim.A_log.float())
        ring_decode(*args, use_qk_l2norm_in_kernel=True, is_kda=is_kda)
        runs.append((out.clone(), sim.state.clone()))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])

"""ring_decode_torch == SGLang's Triton ReplaySSM decode kernel == fp64 gated-delta recurrence.

The Triton kernel runs compiled on a GPU and interpreted on CPU (conftest sets TRITON_INTERPRET).
Scenario: 5 pool slots, 4 decode rows (3 live slots starting at different ring cursors, one
padded row with index -1), 2L+3 steps with natural flushes (cursor L-1) and forced flushes.
Ring positions that are not yet valid are filled with NaN so that any read of them shows up.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sglang_replayssm.kernels.naive import fold_records_fp64, packed_step_fp64
from sglang_replayssm.kernels.ring_decode_ref import ring_decode_torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# On a GPU, SGLang's kernel runs the (d, k) reconstruction on TF32 tensor cores (see its comments);
# the torch reference and the fp64 oracle are exact fp32 / fp64, so the kernel-vs-ref bound is
# looser there. On CPU the interpreter computes in exact fp32.
TRITON_TOL = 2e-3 if DEVICE.type == "cuda" else 1e-5
TOL = 1e-5
L = 4
K = V = 32
NUM_SLOTS = 5
ROW_SLOTS = [3, -1, 0, 4]  # row 1 is padding; slots 1 and 2 are never referenced
START_CURSOR = {3: 0, 0: 2, 4: 3}
STEPS = 2 * L + 3


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| / max |ref| (norm-wise relative error, float64)."""
    x, ref = x.double(), ref.double()
    return float((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def bits(t: torch.Tensor) -> torch.Tensor:
    """Bit pattern of an fp32 tensor (NaN-safe identity comparison)."""
    return t.contiguous().view(torch.int32).clone()


@dataclasses.dataclass
class Pool:
    state: torch.Tensor  # [slots, HV, V, K]
    d: torch.Tensor  # [slots, HV, L, V]
    k: torch.Tensor  # [slots, H, L, K]
    g: torch.Tensor  # [slots, HV, L] or [slots, HV, L, K]

    def clone(self) -> Pool:
        return Pool(*(t.clone() for t in dataclasses.astuple(self)))


@dataclasses.dataclass
class Model:
    H: int
    HV: int
    is_kda: bool
    A_log: torch.Tensor
    dt_bias: torch.Tensor

    def gate_input(self, n: int, gen: torch.Generator) -> torch.Tensor:
        shape = (n, self.HV, K) if self.is_kda else (n, self.HV)
        return torch.randn(shape, generator=gen, dtype=torch.float32)


def make_model(H: int, HV: int, is_kda: bool, gen: torch.Generator) -> Model:
    # Mild decays (alpha ~ 0.9-0.99) so that both the checkpoint and every record matter.
    A_log = torch.log(torch.rand(HV, generator=gen) * 0.9 + 0.1)
    dt_shape = (HV, K) if is_kda else (HV,)
    dt_bias = torch.randn(dt_shape, generator=gen) * 0.5 - 2.0
    return Model(H, HV, is_kda, A_log, dt_bias)


def random_token(model: Model, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    mixed = torch.randn(n, 2 * model.H * K + model.HV * V, generator=gen)
    return mixed, model.gate_input(n, gen), torch.randn(n, model.HV, generator=gen)


def fp64_step(model: Model, state: torch.Tensor, mixed: torch.Tensor, a: torch.Tensor, b: torch.Tensor):
    return packed_step_fp64(
        state, mixed, a, b, model.A_log, model.dt_bias, num_k_heads=model.H, is_kda=model.is_kda, scale=K**-0.5
    )


def make_pool(model: Model, gen: torch.Generator) -> tuple[Pool, dict[int, torch.Tensor]]:
    """Pool with NaN-filled rings; live slots get START_CURSOR[s] fp64-generated records.

    Returns the pool and the true (fp64) state of each live slot.
    """
    HV, H = model.HV, model.H
    pool = Pool(
        state=torch.randn(NUM_SLOTS, HV, V, K, generator=gen) * 0.3,
        d=torch.full((NUM_SLOTS, HV, L, V), float("nan")),
        k=torch.full((NUM_SLOTS, H, L, K), float("nan")),
        g=torch.full((NUM_SLOTS, HV, L, K) if model.is_kda else (NUM_SLOTS, HV, L), float("nan")),
    )
    truth: dict[int, torch.Tensor] = {}
    for s, c in START_CURSOR.items():
        st = pool.state[s : s + 1].double()
        for j in range(c):
            _, st, d, kn, g = fp64_step(model, st, *random_token(model, 1, gen))
            pool.d[s, :, j] = d[0].float()
            pool.k[s, :, j] = kn[0].float()
            pool.g[s, :, j] = g[0].float()
        truth[s] = st[0]
    return pool, truth


def call_decode(fn, model: Model, pool: Pool, mixed, a, b, idx, wp, ff) -> torch.Tensor:
    """Call ``fn`` with the exact keyword set TritonGDNKernel/TritonKDAKernel.packed_decode use."""
    B = mixed.shape[0]
    out = mixed.new_empty(B, 1, model.HV, V)
    kwargs = dict(
        mixed_qkv=mixed, a=a, b=b, A_log=model.A_log.to(DEVICE), dt_bias=model.dt_bias.to(DEVICE),
        scale=K**-0.5, initial_state=pool.state, d_cache=pool.d, k_cache=pool.k, g_cache=pool.g,
        out=out, ssm_state_indices=idx, write_pos=wp, force_flush=ff, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    if model.is_kda:
        kwargs["is_kda"] = True
    res = fn(**kwargs)
    assert res[0] is out and res[1] is pool.state
    return out


def to_dev(p: Pool) -> Pool:
    return Pool(*(t.to(DEVICE) for t in dataclasses.astuple(p)))


def force_schedule(step: int, row: int) -> int:
    # Forced flushes at partial cursors on some steps; never on the padded row's behalf.
    return int((step * 3 + row) % 5 == 0)


@pytest.fixture(scope="module")
def sglang_decode():
    from tests.support.sglang_triton import sglang_replayssm_decode

    return sglang_replayssm_decode()


CASES = {
    "gdn_gva": dict(H=2, HV=4, is_kda=False),
    "kda": dict(H=2, HV=2, is_kda=True),
    "kda_gva": dict(H=1, HV=2, is_kda=True),
}


@pytest.mark.interpret
@pytest.mark.parametrize("case", list(CASES))
def test_ring_decode_matches_triton_and_fp64(case: str, sglang_decode) -> None:
    gen = torch.Generator().manual_seed(1234 + len(case))
    model = make_model(**CASES[case], gen=gen)
    pool_host, truth = make_pool(model, gen)
    ref_pool, tri_pool = to_dev(pool_host), to_dev(pool_host)
    untouched = [s for s in range(NUM_SLOTS) if s not in ROW_SLOTS]
    untouched_bits = {s: [bits(t[s]) for t in dataclasses.astuple(ref_pool)] for s in untouched}

    idx = torch.tensor(ROW_SLOTS, dtype=torch.int32, device=DEVICE)
    cursor = {s: START_CURSOR[s] for s in ROW_SLOTS if s >= 0}
    saw_natural = saw_forced = 0
    for step in range(STEPS):
        mixed, a, b = random_token(model, len(ROW_SLOTS), gen)
        wp = torch.tensor([cursor.get(s, 0) for s in ROW_SLOTS], dtype=torch.int32, device=DEVICE)
        ff_list = [force_schedule(step, r) if s >= 0 else 0 for r, s in enumerate(ROW_SLOTS)]
        ff = torch.tensor(ff_list, dtype=torch.int32, device=DEVICE)
        args = (mixed.to(DEVICE), a.to(DEVICE), b.to(DEVICE), idx, wp, ff)

        out_ref = call_decode(ring_decode_torch, model, ref_pool, *args)
        out_tri = call_decode(sglang_decode, model, tri_pool, *args)

        for r, s in enumerate(ROW_SLOTS):
            if s < 0:
                assert torch.count_nonzero(out_ref[r]) == 0 and torch.count_nonzero(out_tri[r]) == 0
                continue
            o64, truth[s], _, _, _ = fp64_step(model, truth[s][None], mixed[r : r + 1], a[r : r + 1], b[r : r + 1])
            truth[s] = truth[s][0]
            assert rel_err(out_ref[r, 0].cpu(), o64[0]) <= TOL, (step, r)
            assert rel_err(out_tri[r, 0].cpu(), out_ref[r, 0].cpu()) <= TRITON_TOL, (step, r)
            natural = cursor[s] == L - 1
            flush = natural or ff_list[r] == 1
            saw_natural += natural
            saw_forced += flush and not natural
            cursor[s] = 0 if flush else cursor[s] + 1
            for p, tol in ((ref_pool, TOL), (tri_pool, TRITON_TOL)):
                if flush:  # the checkpoint itself is the exact state
                    assert rel_err(p.state[s].cpu(), truth[s]) <= tol, (step, r)
                # checkpoint + first `cursor` records == exact state
                folded = fold_records_fp64(p.state[s], p.d[s], p.k[s], p.g[s], cursor[s], model.is_kda)
                assert rel_err(folded.cpu(), truth[s]) <= tol, (step, r)
        # Both implementations wrote the same ring records (NaN where still unwritten).
        for t_ref, t_tri in zip(dataclasses.astuple(ref_pool), dataclasses.astuple(tri_pool)):
            torch.testing.assert_close(t_tri, t_ref, rtol=TRITON_TOL, atol=TRITON_TOL, equal_nan=True)
    assert saw_natural >= 2 and saw_forced >= 2
    for s in untouched:
        for p in (ref_pool, tri_pool):
            for before, t in zip(untouched_bits[s], dataclasses.astuple(p)):
                assert torch.equal(bits(t[s]), before), f"slot {s} modified"


@pytest.mark.parametrize("is_kda", [False, True])
def test_ring_decode_no_force_flush_matches_fp64(is_kda: bool) -> None:
    """``force_flush=None`` (KDA's production call) flushes only at cursor L-1."""
    gen = torch.Generator().manual_seed(7)
    model = make_model(2, 4 if not is_kda else 2, is_kda, gen)
    pool, truth = make_pool(model, gen)
    pool = to_dev(pool)
    rows = [s for s in ROW_SLOTS if s >= 0]
    idx = torch.tensor(rows, dtype=torch.int32, device=DEVICE)
    cursor = {s: START_CURSOR[s] for s in rows}
    for _ in range(STEPS):
        mixed, a, b = random_token(model, len(rows), gen)
        wp = torch.tensor([cursor[s] for s in rows], dtype=torch.int32, device=DEVICE)
        ckpt_before = pool.state.clone()
        out = call_decode(ring_decode_torch, model, pool, mixed.to(DEVICE), a.to(DEVICE), b.to(DEVICE), idx, wp, None)
        for r, s in enumerate(rows):
            o64, new, _, _, _ = fp64_step(model, truth[s][None], mixed[r : r + 1], a[r : r + 1], b[r : r + 1])
            truth[s] = new[0]
            assert rel_err(out[r, 0].cpu(), o64[0]) <= TOL
            if cursor[s] == L - 1:
                assert rel_err(pool.state[s].cpu(), truth[s]) <= TOL
                cursor[s] = 0
            else:
                assert torch.equal(pool.state[s], ckpt_before[s]), "non-flush step wrote the checkpoint"
                cursor[s] += 1


def test_ring_decode_is_sglang_drop_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bound into SGLang's TritonGDNKernel/TritonKDAKernel.packed_decode, it serves their calls."""
    gdn_mod = pytest.importorskip("sglang.srt.layers.attention.linear.kernels.gdn_triton")
    kda_mod = pytest.importorskip("sglang.srt.layers.attention.linear.kernels.kda_triton")
    monkeypatch.setattr(gdn_mod, "fused_recurrent_gdn_replayssm_decode", ring_decode_torch, raising=False)
    monkeypatch.setattr(kda_mod, "fused_recurrent_linear_replayssm_decode", ring_decode_torch, raising=False)
    gen = torch.Generator().manual_seed(3)
    for is_kda, kernel in ((False, gdn_mod.TritonGDNKernel()), (True, kda_mod.TritonKDAKernel())):
        model = make_model(2, 2 if is_kda else 4, is_kda, gen)
        pool, truth = make_pool(model, gen)
        rows = [s for s in ROW_SLOTS if s >= 0]
        mixed, a, b = random_token(model, len(rows), gen)
        wp = torch.tensor([START_CURSOR[s] for s in rows], dtype=torch.int32)
        o = kernel.packed_decode(
            mixed, a, b, A_log=model.A_log, dt_bias=model.dt_bias, scale=K**-0.5, ssm_states=pool.state,
            cache_indices=torch.tensor(rows, dtype=torch.int32), num_v_heads=model.HV, head_v_dim=V,
            replayssm_d=pool.d, replayssm_k=pool.k, replayssm_g=pool.g, replayssm_write_pos=wp,
            replayssm_force_flush=None,
        )  # fmt: skip
        assert tuple(o.shape) == (1, len(rows), model.HV, V)
        for r, s in enumerate(rows):
            o64, _, _, _, _ = fp64_step(model, truth[s][None], mixed[r : r + 1], a[r : r + 1], b[r : r + 1])
            assert rel_err(o[0, r], o64[0]) <= TOL


def test_ring_decode_rejects_invalid_calls() -> None:
    gen = torch.Generator().manual_seed(5)
    model = make_model(2, 4, False, gen)
    pool, _ = make_pool(model, gen)
    mixed, a, b = random_token(model, 2, gen)

    def call(idx: list[int], wp: list[int], **over) -> None:
        p = pool.clone()
        for name, val in over.items():
            setattr(p, name, val)
        call_decode(
            ring_decode_torch, model, p, mixed, a, b,
            torch.tensor(idx, dtype=torch.int32), torch.tensor(wp, dtype=torch.int32), None,
        )  # fmt: skip

    with pytest.raises(ValueError, match="write_pos"):
        call([0, 3], [0, L])  # cursor past the last ring position
    with pytest.raises(ValueError, match="two valid rows"):
        call([3, 3], [0, 1])
    with pytest.raises(ValueError, match="float32"):
        call([0, 3], [0, 1], g=pool.g.double())
    with pytest.raises(ValueError, match="d_cache"):
        call([0, 3], [0, 1], d=pool.d[:, :, :, :-1])
    call([0, -1], [0, L + 7])  # a padded row's cursor is never looked at


_SUBPROCESS_CHECK = r"""
import torch, triton
from triton.runtime.jit import JITFunction
import sglang.kernels.ops.attention.linear.fused_recurrent_linear_replayssm as real
from tests.support.sglang_triton import sglang_replayssm_decode, load_sglang_triton_module
from sglang_replayssm.kernels.ring_decode_ref import ring_decode_torch
assert isinstance(real.fused_recurrent_linear_replayssm_decode_kernel, JITFunction)  # compiled mode
mod = load_sglang_triton_module()
assert mod is not real and isinstance(real.fused_recurrent_linear_replayssm_decode_kernel, JITFunction)
fn = sglang_replayssm_decode()
torch.manual_seed(0)
H, HV, K, V, L = 1, 2, 32, 32, 4
args = lambda: [torch.randn(2, 2 * H * K + HV * V), torch.randn(2, HV), torch.randn(2, HV),
                torch.rand(HV), torch.randn(HV), K ** -0.5]
a = args(); torch.manual_seed(1)
pools = [[torch.randn(3, HV, V, K), torch.randn(3, HV, L, V), torch.randn(3, H, L, K), -torch.rand(3, HV, L)]]
pools.append([t.clone() for t in pools[0]])
outs = []
for f, p in zip((fn, ring_decode_torch), pools):
    out = torch.empty(2, 1, HV, V)
    f(*a, *p, out, torch.tensor([2, 0], dtype=torch.int32), torch.tensor([3, 1], dtype=torch.int32),
      use_qk_l2norm_in_kernel=True)
    outs.append(out)
assert torch.allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5), (outs[0] - outs[1]).abs().max()
for x, y in zip(*pools):
    assert torch.allclose(x, y, rtol=1e-5, atol=1e-5)
print("OK")
"""


@pytest.mark.interpret
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only loader path")
def test_loader_interprets_even_if_triton_was_imported_compiled() -> None:
    """Triton and SGLang's module imported without TRITON_INTERPRET: the loader still runs the kernel."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _SUBPROCESS_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("OK"), res.stderr[-3000:]

"""materialize (torch reference, Triton kernel, public dispatcher) vs the fp64 fold and the true recurrence.

Rings are produced by running ``ring_decode_torch`` (the SGLang drop-in) for a different number of
steps per slot and layer, so every slot ends at a different cursor, some after a flush. The true
per-layer state of each slot is tracked with the fp64 recurrence. Unwritten ring positions hold NaN.
Runs on CUDA when available (compiled Triton), else on CPU (Triton interpreted, see conftest).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from sglang_replayssm.kernels.materialize import materialize
from sglang_replayssm.kernels.materialize_ref import check_materialize_args, materialize_torch
from sglang_replayssm.kernels.materialize_triton import materialize_triton, rows_per_program
from sglang_replayssm.kernels.naive import (
    compute_beta_fp64,
    compute_gate_fp64,
    fold_records_fp64,
    recurrent_step_fp64,
    unpack_mixed_qkv,
)
from sglang_replayssm.kernels.ring_decode_ref import ring_decode_torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOL = 1e-5
N_LAYERS, N_SLOTS, L, K, V = 2, 10, 4, 32, 32
# Decode steps per source slot (all layers see the same steps, as in SGLang: one cursor per slot).
# With L=4 the cursors end at 3 (full ring), 1 (after a flush), 2, and 0 (flushed on the last step).
STEPS = {0: 3, 1: 5, 2: 2, 3: 4}


def _checked(backend: Callable[..., None]) -> Callable[..., None]:
    """A backend called the way the dispatcher calls it: on the checked call."""
    return lambda *args, **kw: backend(check_materialize_args(*args, **kw))


IMPLS: dict[str, Callable[..., None]] = {
    "dispatch": materialize,
    "torch": _checked(materialize_torch),
    "triton": _checked(materialize_triton),
}
KINDS = {"gdn_gva": (2, 4, False), "kda": (2, 2, True), "kda_gva": (1, 2, True)}


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double().cpu(), ref.double().cpu()
    return float((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32).clone()


@dataclasses.dataclass
class RingPool:
    is_kda: bool
    temporal: torch.Tensor  # [n_layers, slots, HV, V, K]
    d: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor
    cursor: dict[int, int]  # slot -> write_pos (shared by all layers)
    truth: dict[int, list[list[torch.Tensor]]]  # slot -> layer -> fp64 states after 0, 1, ... steps

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.temporal, self.d, self.k, self.g

    def snapshot(self) -> list[torch.Tensor]:
        return [bits(t) for t in self.tensors()]


def build_pool(H: int, HV: int, is_kda: bool, seed: int = 0) -> RingPool:
    gen = torch.Generator().manual_seed(seed)
    g_shape = (N_LAYERS, N_SLOTS, HV, L, K) if is_kda else (N_LAYERS, N_SLOTS, HV, L)
    pool = RingPool(
        is_kda=is_kda,
        temporal=(torch.randn(N_LAYERS, N_SLOTS, HV, V, K, generator=gen) * 0.3).to(DEVICE),
        d=torch.full((N_LAYERS, N_SLOTS, HV, L, V), float("nan"), device=DEVICE),
        k=torch.full((N_LAYERS, N_SLOTS, H, L, K), float("nan"), device=DEVICE),
        g=torch.full(g_shape, float("nan"), device=DEVICE),
        cursor={},
        truth={},
    )
    for layer in range(N_LAYERS):
        A_log = torch.log(torch.rand(HV, generator=gen) * 0.9 + 0.1)
        dt_bias = torch.randn((HV, K) if is_kda else (HV,), generator=gen) * 0.5 - 2.0
        for s, steps in STEPS.items():
            state = pool.temporal[layer, s].double().cpu()
            states = [state]
            wp = 0
            for _ in range(steps):
                mixed = torch.randn(1, 2 * H * K + HV * V, generator=gen)
                a = torch.randn((1, HV, K) if is_kda else (1, HV), generator=gen)
                b = torch.randn(1, HV, generator=gen)
                out = torch.empty(1, 1, HV, V, device=DEVICE)
                ring_decode_torch(
                    mixed.to(DEVICE), a.to(DEVICE), b.to(DEVICE), A_log.to(DEVICE), dt_bias.to(DEVICE), K**-0.5,
                    pool.temporal[layer], pool.d[layer], pool.k[layer], pool.g[layer], out,
                    torch.tensor([s], dtype=torch.int32, device=DEVICE), torch.tensor([wp], dtype=torch.int32, device=DEVICE),
                    use_qk_l2norm_in_kernel=True, is_kda=is_kda,
                )  # fmt: skip
                q, k, v = unpack_mixed_qkv(mixed, H, K, HV, V)
                g = compute_gate_fp64(a, A_log, dt_bias, is_kda=is_kda)
                _, st = recurrent_step_fp64(states[-1][None], q, k, v, g, compute_beta_fp64(b), scale=K**-0.5)
                states.append(st[0])
                wp = 0 if wp == L - 1 else wp + 1
            assert pool.cursor.setdefault(s, wp) == wp
            pool.truth.setdefault(s, []).append(states)
    return pool


@pytest.fixture(scope="module", params=list(KINDS))
def ring_pool(request: pytest.FixtureRequest) -> RingPool:
    H, HV, is_kda = KINDS[request.param]
    return build_pool(H, HV, is_kda)


def run(impl: str, pool: RingPool, rows: list[tuple[int, int, int]]) -> RingPool:
    """Apply ``impl`` to a copy of ``pool`` for rows (src, dst, count); return the copy."""
    out = dataclasses.replace(pool, temporal=pool.temporal.clone(), d=pool.d.clone(), k=pool.k.clone(), g=pool.g.clone())
    src, dst, cnt = (torch.tensor(c, dtype=torch.int32, device=DEVICE) for c in zip(*rows))
    IMPLS[impl](*out.tensors(), src, dst, cnt, is_kda=pool.is_kda)
    return out


def test_generated_rings_cover_the_interesting_cursors(ring_pool: RingPool) -> None:
    cursors = set(ring_pool.cursor.values())
    assert {0, 1, 2, 3} <= cursors  # full ring (L-1 records), partial, and empty after a flush


@pytest.mark.interpret
@pytest.mark.parametrize("impl", list(IMPLS))
def test_materialize_equals_fold_and_recurrence(impl: str, ring_pool: RingPool) -> None:
    p = ring_pool
    c = p.cursor
    rows = [
        (0, 4, c[0]),  # full ring (L-1 records)
        (1, 5, c[1]),
        (2, 2, c[2]),  # in place
        (3, 6, 0),  # count 0: exact copy
        (0, 7, 1),  # partial prefix of slot 0's ring (slot 0 read by two rows)
        (1, -1, 2),  # skipped
        (-1, 8, 2),  # skipped
    ]
    before = p.snapshot()
    res = run(impl, p, rows)

    for src, dst, cnt in rows:
        if src < 0 or dst < 0:
            continue
        for layer in range(N_LAYERS):
            got = res.temporal[layer, dst]
            oracle = fold_records_fp64(
                p.temporal[layer, src], p.d[layer, src], p.k[layer, src], p.g[layer, src], cnt, p.is_kda
            )
            assert rel_err(got, oracle) <= TOL, (impl, src, dst, layer)
            # The ring holds the steps since the last flush, so the true state after
            # (steps - cursor + cnt) steps is what folding cnt records must give.
            n_steps = len(p.truth[src][layer]) - 1 - p.cursor[src] + cnt
            assert rel_err(got, p.truth[src][layer][n_steps]) <= TOL, (impl, src, dst, layer)
    # count 0 is a bit-exact copy
    assert torch.equal(bits(res.temporal[:, 6]), bits(p.temporal[:, 3]))
    # Rings are never written; checkpoints are written only at live destinations.
    for t_before, t_after in zip(before[1:], [bits(t) for t in res.tensors()[1:]]):
        assert torch.equal(t_before, t_after)
    written = {2, 4, 5, 6, 7}
    for s in range(N_SLOTS):
        if s not in written:
            assert torch.equal(bits(res.temporal[:, s]), before[0][:, s]), f"slot {s} modified"


@pytest.mark.interpret
def test_triton_matches_torch_reference(ring_pool: RingPool) -> None:
    rows = [(s, 4 + s, ring_pool.cursor[s]) for s in range(4)]
    ref = run("torch", ring_pool, rows)
    tri = run("triton", ring_pool, rows)
    assert rel_err(tri.temporal, ref.temporal) <= 1e-6


@pytest.mark.interpret
def test_triton_walks_row_blocks_with_skipped_rows(ring_pool: RingPool) -> None:
    """A batch-sized launch (71 rows: two rows per program, the last block half past the end) whose
    live rows sit at a block's first and second place and in the tail block, as in the decode track."""
    assert rows_per_program(71) == 2 and rows_per_program(32) == 1 and rows_per_program(256) == 8
    rows = [(-1, -1, 0)] * 71
    for at, s in {0: 0, 33: 1, 50: 2, 70: 3}.items():
        rows[at] = (s, 4 + s, ring_pool.cursor[s])
    rows[12] = (2, -1, 1)  # a source without a destination is skipped too
    ref = run("torch", ring_pool, rows)
    tri = run("triton", ring_pool, rows)
    assert rel_err(tri.temporal, ref.temporal) <= 1e-6
    assert not torch.equal(bits(tri.temporal[:, 7]), bits(ring_pool.temporal[:, 7]))


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_materialize_rejects_invalid_rows(impl: str, ring_pool: RingPool) -> None:
    with pytest.raises(ValueError, match="distinct"):
        run(impl, ring_pool, [(0, 5, 1), (1, 5, 1)])
    with pytest.raises(ValueError, match="reads"):
        run(impl, ring_pool, [(0, 5, 1), (5, 6, 1)])
    with pytest.raises(ValueError, match="count"):
        run(impl, ring_pool, [(0, 5, L + 1)])
    with pytest.raises(ValueError, match="out of range"):
        run(impl, ring_pool, [(0, N_SLOTS, 1)])
    bad = dataclasses.replace(ring_pool, g=ring_pool.g.double())
    with pytest.raises(ValueError, match="float32"):
        run(impl, bad, [(0, 5, 1)])
    # Only skipped rows: nothing changes, no error.
    res = run(impl, ring_pool, [(-1, 5, L + 9), (0, -1, 2)])
    assert torch.equal(bits(res.temporal), bits(ring_pool.temporal))

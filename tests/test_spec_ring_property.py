"""Property: random verify / accept / commit streams over SGLang 0.5.23's spec-verify ring (its own
Triton kernels: ``gdn_replayssm_spec_decode`` in verify mode, ``commit_gdn_replayssm_spec``,
``commit_gdn_replayssm_circular``; interpreted on CPU), with the plugin's fold (a mover: finish,
backup, extend) dropped in at random points.

After every step, for every request: the verify outputs of its accepted tokens equal the fp64
gated delta rule over its accepted token stream, and the plugin's :meth:`SpecRing.folded_temporal`
(the state a mover sees after folding) equals the fp64 state (relative error <= 1e-5); a fold
leaves the row's ring empty and does not change the outputs of later verifies. Derandomised:
the same streams every run.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from sglang_replayssm.radix.spec.ring import spec_ring

H, HV, K, V, L, T = 1, 2, 32, 32, 16, 4
REQS = 2  # requests, each on its own row and slot
STEPS = 14
SEEDS = [0, 1]


def _gdn_fp64(state: torch.Tensor, q, k, v, a, b, A_log, dt_bias) -> tuple[torch.Tensor, torch.Tensor]:
    """One token, fp64: state [HV,V,K]; q,k [H,K]; v [HV,V]; a,b [HV]. Returns (o [HV,V], state)."""
    qn = torch.nn.functional.normalize(q.double(), dim=-1, eps=1e-6) * K ** -0.5
    kn = torch.nn.functional.normalize(k.double(), dim=-1, eps=1e-6)
    qn, kn = qn.repeat_interleave(HV // H, 0), kn.repeat_interleave(HV // H, 0)
    g = -torch.exp(A_log.double()) * torch.nn.functional.softplus(a.double() + dt_bias.double())
    beta = torch.sigmoid(b.double())
    s = state * torch.exp(g)[:, None, None]
    delta = beta[:, None] * (v.double() - torch.einsum("hvk,hk->hv", s, kn))
    s = s + delta[:, :, None] * kn[:, None, :]
    return torch.einsum("hvk,hk->hv", s, qn), s


def _pool() -> SimpleNamespace:
    rows = slots = REQS + 1
    cache = SimpleNamespace(
        temporal=torch.zeros(1, slots, HV, V, K), replayssm_d=torch.zeros(1, rows, HV, L, V),
        replayssm_k=torch.zeros(1, rows, H, L, K), replayssm_g=torch.zeros(1, rows, HV, L),
        replayssm_rawv=None, replayssm_rawk=None, replayssm_beta=None)
    return SimpleNamespace(mamba_cache=cache, replayssm_spec_fold=False,
                           replayssm_spec_write_pos=torch.zeros(rows, dtype=torch.int32),
                           replayssm_cache_base=torch.zeros(rows, dtype=torch.int32),
                           replayssm_is_flush=torch.zeros(rows, dtype=torch.int8))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / max(float(b.double().norm()), 1e-30))


@pytest.mark.parametrize("seed", SEEDS)
def test_verify_accept_commit_streams_with_random_folds(seed: int) -> None:
    from sglang.kernels.ops.attention.linear.gdn_replayssm_spec_decode import (
        commit_gdn_replayssm_circular,
        commit_gdn_replayssm_spec,
        gdn_replayssm_spec_decode,
    )

    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    A_log = torch.randn(HV, generator=gen) * 0.3
    dt_bias = torch.randn(HV, generator=gen) * 0.3
    pool = _pool()
    c = pool.mamba_cache
    view = spec_ring(pool)
    assert view is not None
    slots = torch.arange(1, REQS + 1)
    rows = torch.arange(1, REQS + 1)
    ref = [torch.zeros(HV, V, K, dtype=torch.float64) for _ in range(REQS)]
    folds = 0
    for _ in range(STEPS):
        q = torch.randn(REQS * T, H, K, generator=gen)
        k = torch.randn(REQS * T, H, K, generator=gen)
        v = torch.randn(REQS * T, HV, V, generator=gen)
        a = torch.randn(REQS * T, HV, generator=gen)
        b = torch.randn(REQS * T, HV, generator=gen)
        out = torch.empty(REQS * T, HV, V)
        gdn_replayssm_spec_decode(
            q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, checkpoint_state=c.temporal[0],
            d_cache=c.replayssm_d[0], k_cache=c.replayssm_k[0], g_cache=c.replayssm_g[0], rawv_cache=None,
            rawk_cache=None, beta_cache=None, out=out, query_start_loc=torch.arange(0, REQS * T + 1, T),
            ssm_state_indices=slots, replay_indices=rows, write_pos=pool.replayssm_spec_write_pos,
            cache_base=pool.replayssm_cache_base, is_flush=pool.replayssm_is_flush, max_cache_len=L,
            max_spec_len=T, scale=K ** -0.5, use_qk_l2norm_in_kernel=True, null_block_id=-1,
            launch_mode="verify", dot_precision="ieee")
        accept = torch.tensor([rng.randint(1, T) for _ in range(REQS)], dtype=torch.int32)
        for i in range(REQS):
            s = ref[i]
            for t in range(T):
                j = i * T + t
                o, s_next = _gdn_fp64(s, q[j], k[j], v[j], a[j], b[j], A_log, dt_bias)
                assert _rel(out[j], o) <= 1e-5, (i, t)  # every draft's output is exact
                s = s_next
                if t + 1 == int(accept[i]):
                    ref[i] = s  # the committed state: the accepted prefix
        commit_gdn_replayssm_spec(
            write_pos=pool.replayssm_spec_write_pos, cache_base=pool.replayssm_cache_base,
            is_flush=pool.replayssm_is_flush, num_accepted=accept, replay_indices=rows, max_cache_len=L,
            max_spec_len=T, fold_every_commit=False, null_block_id=-1)
        commit_gdn_replayssm_circular(
            checkpoint_state=c.temporal, d_cache=c.replayssm_d, k_cache=c.replayssm_k, g_cache=c.replayssm_g,
            d_residual_cache=None, k_residual_cache=None, state_batch_indices=slots, replay_indices=rows,
            write_pos=pool.replayssm_spec_write_pos, cache_base=pool.replayssm_cache_base,
            is_flush=pool.replayssm_is_flush, accept_lens=accept)
        full = view.folded_temporal(slots, rows)
        for i in range(REQS):
            assert _rel(full[0, i], ref[i]) <= 1e-5, i
        pick = [i for i in range(REQS) if rng.random() < 0.3]
        if pick:  # a mover folds these rows (finish donation, CPU backup, extend)
            view.fold(slots[pick], rows[pick])
            folds += 1
            for i in pick:
                assert int(pool.replayssm_spec_write_pos[i + 1]) == 0
                assert _rel(c.temporal[0, i + 1], ref[i]) <= 1e-5
    assert int(pool.replayssm_spec_write_pos.max()) > 0 or folds > 0

"""The startup warm-up of the rebuild paths (``radix/records/warmup.py``) on SGLang's real CPU pools: it runs once,
at the first forward after every layer has records, folds into the padding slot only, and leaves every owned
slot, record and kept state bit for bit as it was."""

from __future__ import annotations

import types

import pytest
import torch

from sglang_replayssm.radix.records import rebuild as rb
from sglang_replayssm.radix.records.warmup import CHUNK_RECORDS, PADDING_SLOT, SEQUENTIAL_RECORDS, warm_up
from tests.support.launch_count import OpCounter, _setup


def _write(pool, layers, backend, model, kv, gen) -> None:
    n = kv.numel()
    for layer in layers:
        pool.write(layer, backend, kv, torch.randn(n, model.qkv_dim, generator=gen),
                   torch.randn(n, model.HV, generator=gen), torch.randn(n, model.HV, generator=gen))


def _snapshot(req_pool, pool) -> list[torch.Tensor]:
    cache = req_pool.mamba_pool.mamba_cache
    return [t.clone() for t in (*cache.conv, cache.temporal, pool.xs, *pool.ab, pool.slot_of, pool.owner,
                                *pool.states.ssm.values())]


def test_the_warm_up_folds_into_the_padding_slot_once_and_touches_nothing_else(radix_adapter, monkeypatch):
    counter = OpCounter()
    with _setup(3, counter, True) as (model, req_pool, layers, backend, pool, gen):
        kv = torch.randperm(1000, generator=gen)[:300]
        pool.assign(kv)
        runner = types.SimpleNamespace(req_to_token_pool=req_pool)
        assert not warm_up(pool, req_pool, rb.rebuild)  # no layer has records yet
        _write(pool, layers[:2], backend, model, kv, gen)
        assert not warm_up(pool, req_pool, rb.rebuild) and not pool.warmed  # a forward's capture is not complete
        _write(pool, layers[2:], backend, model, kv, gen)
        assert pool.xs is not None and pool.ab is not None
        for rows in (pool.xs, *pool.ab):  # the sink row: what tokens without a slot wrote
            rows[:, pool.capacity] = torch.randn(rows[:, pool.capacity].shape, generator=gen)
        cache = req_pool.mamba_pool.mamba_cache
        owned = torch.arange(1, cache.temporal.shape[1])
        cache.temporal[:, owned] = 0.1 * torch.randn(cache.temporal[:, owned].shape, generator=gen)
        before = _snapshot(req_pool, pool)

        with counter:
            assert rb.run_pending(runner) == 0  # nothing queued: the warm-up alone
        assert pool.warmed
        # a span of each kind Triton compiles apart: token counts divisible by 16 and not
        assert counter.launches["KERNEL extend"] == 2 and counter.launches["KERNEL conv"] == 2
        assert sorted(n % 16 == 0 for n in CHUNK_RECORDS) == [False, True]
        after = _snapshot(req_pool, pool)
        temporal = 1 + len(cache.conv)
        assert not torch.equal(after[temporal - 1][:, PADDING_SLOT], before[temporal - 1][:, PADDING_SLOT])
        for i, (b, a) in enumerate(zip(before, after)):
            if i < temporal:  # the pool's conv and temporal stacks: every slot but the padding one
                assert torch.equal(b[:, 1:], a[:, 1:]), i
            else:
                assert torch.equal(b, a), i

        counter.launches.clear()
        with counter:
            assert not warm_up(pool, req_pool, rb.rebuild) and rb.run_pending(runner) == 0  # once per pool
        assert counter.total() == 0


@pytest.mark.parametrize("stacked", [True, False])
def test_where_short_spans_fold_token_by_token_both_paths_warm_up(radix_adapter, monkeypatch, stacked):
    """Per-layer pools (KDA's, hand-built ones) fold short spans token by token: the warm-up runs that path too.
    Stacked GDN pools fold every span by chunks (fewer launches for every layer at once): both warm-ups do."""
    counter = OpCounter()
    folded: list[list[int]] = []
    monkeypatch.setattr(rb, "_fold_sequential", lambda *args, **kw: folded.append(torch.diff(args[8]).tolist()))
    with _setup(2, counter, stacked) as (model, req_pool, layers, backend, pool, gen):
        pool.sequential_tokens = 32
        kv = torch.randperm(1000, generator=gen)[:40]
        pool.assign(kv)
        _write(pool, layers, backend, model, kv, gen)
        with counter:
            assert warm_up(pool, req_pool, rb.rebuild)
        if stacked:
            assert counter.launches["KERNEL extend"] == len(CHUNK_RECORDS) + 1 and folded == []
        else:  # the chunk rebuilds of CHUNK_RECORDS, layer by layer, then the sequential one
            assert counter.launches["KERNEL extend"] == len(CHUNK_RECORDS) * len(layers)
            assert folded == [[SEQUENTIAL_RECORDS]] * len(layers)
        assert min(CHUNK_RECORDS) > pool.sequential_tokens >= SEQUENTIAL_RECORDS

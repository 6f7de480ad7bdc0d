"""The startup warm-up of the rebuild paths (``radix/records/warmup.py``) on SGLang's real CPU pools: it runs once,
at the first forward after every layer has records, folds into the padding slot only, and leaves every owned
slot, record and kept state bit for bit as it was."""

from __future__ import annotations

import types

import pytest
import torch

from sglang_replayssm.radix.records import rebuild as rb
from sglang_replayssm.radix.records import warmup
from sglang_replayssm.radix.records.warmup import (
    CHUNK_RECORDS,
    PADDING_SLOT,
    SEQUENTIAL_RECORDS,
    bucket_spans,
    warm_up,
)
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
        # a span of each kind Triton compiles apart (token counts divisible by 16, neither, and 1), and a one-chunk span
        assert counter.launches["KERNEL extend"] == 4 and counter.launches["KERNEL conv"] == 4
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
            assert counter.launches["KERNEL extend"] == len(CHUNK_RECORDS) + 2 and folded == []  # + 8 and 1 record
        else:  # the chunk rebuilds of CHUNK_RECORDS, layer by layer, then the sequential one
            assert counter.launches["KERNEL extend"] == len(CHUNK_RECORDS) * len(layers)
            assert folded == [[SEQUENTIAL_RECORDS]] * len(layers)
        assert min(CHUNK_RECORDS) > pool.sequential_tokens >= SEQUENTIAL_RECORDS


def test_on_cuda_the_warm_up_reaches_every_conv_bucket_a_step_of_the_most_jobs_can_use(radix_adapter, monkeypatch):
    """SGLang's Triton conv compiles a variant per row count of its windows (the stacked conv's buckets) and per
    token-count kind: the warm-up runs a step of the fewest jobs of every bucket up to the pool's most jobs a step,
    at both kinds, all into the padding slot (CPU: the same steps when given ``max_jobs``; none by default, where the
    conv is not Triton's), up to the largest bucket whose work windows fit ``MAX_WARM_WINDOW_BYTES``."""
    from sglang.srt.layers.attention.linear import gdn_backend

    assert bucket_spans(16) == [] and [len(s) for s in bucket_spans(40)] == [17, 17, 33, 33]
    counter = OpCounter()
    with _setup(2, counter, True) as (model, req_pool, layers, backend, pool, gen):
        seen: list[tuple[int, int, bool]] = []
        counted = gdn_backend.causal_conv1d_fn

        def spy(*args, **kwargs):
            lens = kwargs["seq_lens_cpu"]
            seen.append((int(kwargs["conv_states"].shape[0]), len(lens), sum(lens) % 16 == 0))
            return counted(*args, **kwargs)

        gdn_backend.causal_conv1d_fn = spy  # _setup puts its own back on exit
        kv = torch.randperm(1000, generator=gen)[:40]
        pool.assign(kv)
        _write(pool, layers, backend, model, kv, gen)
        cache = req_pool.mamba_pool.mamba_cache
        owned = torch.arange(1, cache.temporal.shape[1])
        cache.temporal[:, owned] = 0.1 * torch.randn(cache.temporal[:, owned].shape, generator=gen)
        before = _snapshot(req_pool, pool)
        assert warm_up(pool, req_pool, rb.rebuild, max_jobs=40)
        kinds = sorted(n % 16 == 0 for n in CHUNK_RECORDS)
        assert seen == [(16, 1, k) for k in (False, True, False, False)] + [(r, r // 2 + 1, k) for r in (32, 64) for k in kinds]
        after = _snapshot(req_pool, pool)
        temporal = 1 + len(cache.conv)
        for i, (b, a) in enumerate(zip(before, after)):  # every slot but the padding one, every record, as it was
            assert torch.equal(b[:, 1:], a[:, 1:]) if i < temporal else torch.equal(b, a), i

    with _setup(2, OpCounter(), True) as (model, req_pool, layers, backend, pool, gen):
        kv = torch.randperm(1000, generator=gen)[:40]
        pool.assign(kv)
        _write(pool, layers, backend, model, kv, gen)
        calls: list[int] = []
        assert warm_up(pool, req_pool, lambda p, r, jobs: calls.append(len(jobs)))
        assert calls == [1] * (len(CHUNK_RECORDS) + 2)  # CPU, no max_jobs: no bucket step
        # work windows of 63 rows fit the byte cap: the buckets stop at 32 rows (17 jobs)
        row_bytes = pool.xs.shape[0] * pool.xs.shape[-1] * pool.conv_lead * pool.xs.element_size()
        monkeypatch.setattr(warmup, "MAX_WARM_WINDOW_BYTES", 63 * row_bytes)
        pool.warmed, calls[:] = False, []
        assert warm_up(pool, req_pool, lambda p, r, jobs: calls.append(len(jobs)), max_jobs=200)
        assert calls == [1] * (len(CHUNK_RECORDS) + 2) + [17, 17]

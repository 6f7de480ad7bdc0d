"""Interval states from a real prefill's chunk states (``capture.keep_chunk_states``), GDN and KDA: kept at
the interval, and a rebuild from them equals the fp64 recurrence of the path (SGLang's real pools, the CPU
runtime's extend kernels; the helpers are tests/test_radix_records.py's). Prefill CUDA graphs and records: a
replayed linear extend drops its tokens' records, KDA's extend stays out of breakable graphs where records capture,
full graphs are named at startup."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from sglang_replayssm.radix.records.match import Rebuild
from sglang_replayssm.radix.records.rebuild import rebuild
from tests.test_radix_records import _check, _kda_oracle, _oracle, _setup_rebuild


def _two_prefills(req_pool, layer, seqs, after_90, model, x):
    """The layer's cache with the two prefills' start states (zero; the fp64 state after the first 90 tokens),
    and its ``q, k, v`` for all 300 tokens (conv from zero, SiLU): what the forward's extend receives."""
    cache = req_pool.mamba2_layer_cache(layer.layer_id)
    cache.temporal[seqs[0]] = 0
    cache.temporal[seqs[1]] = after_90.float()
    conv = torch.cat([torch.zeros(model.win, x.shape[1]), x])
    mixed = torch.stack([(conv[t:t + model.win + 1].T * layer.conv_weights).sum(-1) for t in range(300)])
    return cache, torch.split(torch.nn.functional.silu(mixed + layer.bias), [layer.q_dim, layer.k_dim, layer.v_dim],
                              dim=-1)


def _rebuild_from_kept(model, req_pool, layers, inputs, pool, kv, depths, kda=False):
    """The two prefills (``[0, 90)``, then ``[90, 300)``) kept depths 154 and 282 (the first chunk starts at or
    past 128 and 256); each depth rebuilds from the deepest kept state at or above it, folding only the records
    past it, and equals the fp64 recurrence."""
    from sglang_replayssm.radix.records.match import _from_interval_state

    assert [int(kv.tolist().index(int(k))) + 1 for k in pool.states.owner[:2]] == [154, 282]
    jobs = []
    for n in depths:
        start = _from_interval_state(pool, kv[:n])
        assert start is not None
        state, lead, slots = start
        jobs.append(Rebuild(dst=req_pool.mamba_allocator.alloc(1), src=None, slots=slots, state=state, lead=lead))
    assert [j.slots.numel() - j.lead for j in jobs] == [n - (282 if n >= 282 else 154) for n in depths]
    rebuild(pool, req_pool, jobs)
    _check(model, req_pool, layers, inputs, jobs, list(depths), oracle=_kda_oracle if kda else None, kda=kda)


def test_kept_chunk_states_are_the_prefill_states(radix_adapter):
    """A prefill through the CPU extend kernel keeps its chunk states (``keep_chunk_states``) at the
    interval; a match's rebuild from them equals the fp64 recurrence of the path."""
    from sglang_replayssm.radix.records import capture as record_capture
    from sglang_replayssm.radix.records.interval_states import IntervalStates, kept_positions
    from sglang_replayssm.state import state_of

    model, req_pool, layers, backend, pool, kv, inputs = _setup_rebuild(300, seed=3)
    dispatcher = types.SimpleNamespace()  # the extend hook's dispatcher, carrying the step's context
    pool.states = IntervalStates(kv_size=512, capacity=8, interval=128, device=torch.device("cpu"))
    # Two prefills in one batch: tokens [0, 90) from the root, then [90, 300) after a 90-token prefix.
    prefix, lens = [0, 90], [90, 210]
    loc = torch.cat([kv[:90], kv[90:300]])
    tokens, _ = kept_positions(prefix, lens, 128)
    pool.states.assign(loc[torch.tensor(tokens)])
    fb = types.SimpleNamespace(extend_prefix_lens_cpu=prefix, extend_seq_lens_cpu=lens, out_cache_loc=loc)
    alloc = req_pool.mamba_allocator
    seqs = [alloc.alloc(1), alloc.alloc(1)]
    for layer, (x, a, b) in zip(layers, inputs):
        cache, (q, k, v) = _two_prefills(req_pool, layer, seqs, _oracle(layer, model, x, a, b, 90), model, x)
        g, beta = backend._prefill_gates(layer, a, b)
        result = backend.kernel_dispatcher.extend(
            q=q.reshape(1, 300, model.H, model.K), k=k.reshape(1, 300, model.H, model.K),
            v=v.reshape(1, 300, model.HV, model.V), g=g, beta=beta, ssm_states=cache.temporal,
            cache_indices=torch.cat(seqs).to(torch.int32), query_start_loc=torch.tensor([0, 90, 300]))
        state_of(dispatcher).extending = (pool, layer, fb)
        record_capture.keep_chunk_states(result, dispatcher, cache.temporal)
    state_of(dispatcher).extending = None
    _rebuild_from_kept(model, req_pool, layers, inputs, pool, kv, (160, 154, 299))


def test_kda_kept_chunk_states_are_the_prefill_states(radix_adapter):
    """KDA's extend returns ``(o, h)`` while SGLang tracks a request of the batch: its chunk states are kept
    at the interval (``h_at=1``) and a rebuild from them equals the fp64 recurrence. An extend that returns
    no ``h`` keeps nothing and its assigned keys lose their slots (never a slot the forward did not write)."""
    from sglang_replayssm.cpu.kda import chunk_kda
    from sglang_replayssm.radix.records import capture as record_capture
    from sglang_replayssm.radix.records.interval_states import IntervalStates, kept_positions
    from sglang_replayssm.radix.records.match import _from_interval_state
    from sglang_replayssm.state import state_of

    model, req_pool, layers, backend, pool, kv, inputs = _setup_rebuild(300, seed=5, kind="kda")
    prefix, lens = [0, 90], [90, 210]
    loc = torch.cat([kv[:90], kv[90:300]])
    tokens, _ = kept_positions(prefix, lens, 128)
    alloc = req_pool.mamba_allocator
    for with_h in (False, True):
        pool.states = IntervalStates(kv_size=512, capacity=8, interval=128, device=torch.device("cpu"))
        pool.states.assign(loc[torch.tensor(tokens)])
        dispatcher = types.SimpleNamespace()
        fb = types.SimpleNamespace(extend_prefix_lens_cpu=prefix, extend_seq_lens_cpu=lens, out_cache_loc=loc)
        seqs = [alloc.alloc(1), alloc.alloc(1)]
        for layer, (x, a, b) in zip(layers, inputs):
            cache, (q, k, v) = _two_prefills(req_pool, layer, seqs, _kda_oracle(layer, model, x, a, b, 90), model, x)
            result = chunk_kda(q.reshape(1, 300, model.H, model.K), k.reshape(1, 300, model.H, model.K),
                               v.reshape(1, 300, model.HV, model.V), a.reshape(1, 300, model.HV, model.K),
                               b.unsqueeze(0), ssm_states=cache.temporal, cache_indices=torch.cat(seqs).to(torch.int32),
                               query_start_loc=torch.tensor([0, 90, 300]), A_log=layer.A_log, dt_bias=layer.dt_bias,
                               beta_is_raw=True, return_intermediate_states=with_h, track_state=None,
                               track_chunk_idx=None)
            state_of(dispatcher).extending = (pool, layer, fb)
            record_capture.keep_chunk_states(result, dispatcher, cache.temporal, h_at=1)
        if not with_h:  # keys without a written state: no state found anywhere on the path
            assert not bool((pool.states.state_of >= 0).any()) and _from_interval_state(pool, kv[:299]) is None
    _rebuild_from_kept(model, req_pool, layers, inputs, pool, kv, (160, 282, 299), kda=True)


def _replay(hook: str, req_pool: Any, loc: torch.Tensor) -> None:
    """Call ``hook`` as SGLang does before a prefill graph replay of a batch whose tokens are ``loc``."""
    from sglang_replayssm.radix.records import hooks

    batch = types.SimpleNamespace(out_cache_loc=loc)
    if hook == "kda-breakable":  # KDAAttnBackend.refresh_prefill_graph_metadata (AFTER)
        hooks.drop_graph_replayed_records(None, types.SimpleNamespace(req_to_token_pool=req_pool), object(), batch)
    else:  # PrefillCudaGraphRunner.execute (BEFORE), a full graph or a breakable one
        runner = types.SimpleNamespace(_is_full_backend=hook == "full",
                                       model_runner=types.SimpleNamespace(req_to_token_pool=req_pool))
        hooks.drop_full_graph_records(runner, batch)


@pytest.mark.parametrize("hook", ["kda-breakable", "full", "gdn-breakable"])
def test_a_replayed_prefill_graph_keeps_no_records(hook):
    """A linear layer's extend inside a prefill CUDA graph (KDA's in a breakable graph, every layer in a full
    one) runs none of our Python at replay: the hook SGLang calls before each replay drops the batch's record
    slots and interval states (tokens without records are lost hits, never rebuilt from rows no forward
    wrote); other tokens keep theirs. A breakable graph's GDN layers run eagerly (captured): nothing dropped."""
    from sglang_replayssm.radix.records.interval_states import IntervalStates
    from sglang_replayssm.radix.records.pool import RecordPool, attach

    req_pool = types.SimpleNamespace()
    pool = attach(req_pool, RecordPool(kv_size=64, capacity=32, device=torch.device("cpu")))
    pool.states = IntervalStates(kv_size=64, capacity=4, interval=64, device=torch.device("cpu"))
    kept, replayed = torch.arange(1, 9), torch.arange(20, 30)
    for loc in (kept, replayed):
        pool.assign(loc)
        pool.states.assign(loc[-1:])
    assert pool.covered(kept) and pool.covered(replayed)
    _replay(hook, req_pool, replayed)
    if hook == "gdn-breakable":
        assert pool.covered(replayed) and pool.states.deepest(replayed) is not None
    else:
        assert bool((pool.slots(replayed) < 0).all()) and pool.states.deepest(replayed) is None
    assert pool.covered(kept) and pool.states.deepest(kept) == (7, int(pool.states.state_of[8]))


def _kda_backend(req_pool: Any) -> Any:
    """SGLang's ``KDAAttnBackend`` with what ``supports_prefill_graph_extend`` reads: the Triton extend kernel (its
    default), no fused-accept staging, the request pool."""
    from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend
    from sglang.srt.layers.attention.linear.kernels.kda_triton import TritonKDAKernel

    backend = object.__new__(KDAAttnBackend)
    backend.kernel_dispatcher = types.SimpleNamespace(extend_kernel=object.__new__(TritonKDAKernel))
    backend.accept_lens_pool = None
    backend.req_to_token_pool = req_pool
    return backend


@pytest.mark.parametrize("records", [True, False])
@pytest.mark.parametrize("fix_on", [True, False])
def test_kda_breakable_graphs_run_the_extend_eagerly_where_records_capture(radix_adapter, monkeypatch, records,
                                                                          fix_on):
    """SGLang's breakable prefill graphs (its default on CUDA) capture KDA's extend when the backend says it can
    (``supports_prefill_graph_extend``, read when the hybrid backend is built): no layer Python runs at replay,
    so no record is captured. With records on a decode-ring pool the answer is no (fix ``record_kda_graph_eager``):
    the graph breaks at each KDA layer as at GDN's. Without records, or with the fix off, it is SGLang's."""
    from sglang_replayssm.radix import config
    from sglang_replayssm.radix.records.pool import RecordPool, attach

    mamba_pool = types.SimpleNamespace(enable_linear_replayssm=True, replayssm_write_pos=torch.zeros(4),
                                       mamba_cache=types.SimpleNamespace(replayssm_d=0, replayssm_k=0, replayssm_g=0))
    req_pool = types.SimpleNamespace(mamba_pool=mamba_pool)
    if records:
        attach(req_pool, RecordPool(kv_size=64, capacity=32, device=torch.device("cpu")))
    with config.override(True, record_kda_graph_eager=fix_on):
        assert _kda_backend(req_pool).supports_prefill_graph_extend() is not (records and fix_on)
        # SGLang's decision, as it builds the hybrid backend under breakable prefill graphs: capture the extend or not
        from sglang.srt.layers.attention import hybrid_linear_attn_backend as hybrid

        monkeypatch.setattr(hybrid, "check_cuda_graph_backend",
                            lambda phase, name: phase == "prefill" and name == "breakable")
        linear = _kda_backend(req_pool)
        linear.prefill_graph_max_seqs = 128
        full = types.SimpleNamespace(token_to_kv_pool=None, req_to_token_pool=req_pool, kv_index_translator=None,
                                     needs_cpu_seq_lens=False,
                                     use_captured_forward_metadata_for_breakable_cuda_graph=False)
        backend = hybrid.HybridLinearAttnBackend(full, linear, [3])
        assert backend.use_captured_forward_metadata_for_breakable_cuda_graph is not (records and fix_on)


@pytest.mark.parametrize("backend", ["full", "breakable", "disabled"])
def test_full_prefill_graphs_are_named_at_startup(monkeypatch, caplog, backend):
    """A full prefill CUDA graph replays every linear layer inside the graph (its prefills keep no records): the
    record pool's startup says so in one warning; SGLang's default (breakable) and no prefill graph say nothing."""
    import logging

    from sglang.srt.model_executor import cuda_graph_config

    from sglang_replayssm.radix.records import startup

    monkeypatch.setattr(cuda_graph_config, "check_cuda_graph_backend",
                        lambda phase, name: phase == cuda_graph_config.Phase.PREFILL and name == backend)
    with caplog.at_level(logging.WARNING, logger=startup.logger.name):
        assert startup._warn_full_prefill_graphs() is (backend == "full")
    assert ("full prefill CUDA graphs" in caplog.text) is (backend == "full")

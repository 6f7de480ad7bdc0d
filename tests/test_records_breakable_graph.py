"""Records under SGLang's breakable prefill CUDA graphs (its default on CUDA, up to ``chunked_prefill_size`` tokens).

Every GDN layer then runs as an eager break between captured segments, through SGLang's own break body
(``_linear_attention_with_output_impl``, ``radix_linear_attention.py:168``): it narrows ``out_cache_loc`` to the
batch's real tokens (a new view at every layer) and passes the layer's inputs as weak views of the segments' memory
pool, which a later segment may reuse before the forward's last layer. Driven here through that body, inside SGLang's
``prefill_graph_scope`` and ``enable_breakable_cuda_graph`` scopes, on SGLang's CPU pools (a padded bucket's shapes).
"""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from sglang_replayssm.radix.records import capture as cap
from sglang_replayssm.radix.records.interval_states import kept_positions
from tests.support.launch_count import OpCounter, _setup

BUCKET = 512  # the graph's token bucket; the forward's real tokens fill more than half of it


class _Breaks:
    """What the break body calls as the attention backend: the records' capture and kept states (the plugin's hooks
    on GDN's ``forward_extend`` / dispatcher ``extend``), then an output. Keeps each layer's inputs as passed."""

    def __init__(self, backend, ssm, gen, model) -> None:
        self.backend, self.ssm, self.gen, self.model = backend, ssm, gen, model
        self.inputs: list[tuple[torch.Tensor, ...]] = []
        self.held_after_layer: list[int] = []

    def forward(self, *, layer, forward_batch, mixed_qkv, a, b, linear_attn_output):
        n = mixed_qkv.shape[0]
        h = torch.randn(1, (n + 63) // 64, self.model.HV, self.model.V, self.model.K, generator=self.gen)
        cap.capture(self.backend, layer, forward_batch, mixed_qkv, a, b)
        with cap.extending(self.backend, layer, forward_batch):
            cap.keep_chunk_states((None, None, h), self.backend.kernel_dispatcher, self.ssm)
        pool = cap.pool_of(self.backend.req_to_token_pool)
        self.held_after_layer.append(len(pool.staged))
        self.inputs.append((mixed_qkv.clone(), a.clone(), b.clone(), h[0].clone()))
        return linear_attn_output


def _forward(rla, breaks, pool, layers, model, gen, real: int, nan_after: bool) -> torch.Tensor:
    """One prefill of ``real`` tokens in a bucket of :data:`BUCKET` rows, every GDN layer through SGLang's break body;
    ``nan_after``: each layer's inputs overwritten after its break (the pool reused by the next segment). Returns the
    bucket's ``out_cache_loc``."""
    loc = torch.randperm(1000, generator=gen)[:BUCKET]  # the bucket's static rows; the padding past ``real``
    pool.invalidate(loc)
    pool.assign(loc[:real])
    kept, _ = kept_positions([0], [real], pool.states.interval, pool.states.chunk)
    if kept:
        pool.states.assign(loc[torch.tensor(kept, dtype=torch.long)])
    fb = types.SimpleNamespace(out_cache_loc=loc, forward_mode=types.SimpleNamespace(is_decode=lambda: False),
                               spec_info=None, extend_prefix_lens_cpu=[0], extend_seq_lens_cpu=[real],
                               global_num_token_non_padded_cpu=real)
    breaks.inputs.clear()
    breaks.held_after_layer.clear()
    for layer in layers:
        # SGLang's CUDA prefill layout (qwen3_5_gdn_prefill_projection_views): b, a strided views of one projection
        x, ba = torch.randn(BUCKET, model.qkv_dim, generator=gen), torch.randn(BUCKET, 2 * model.HV, generator=gen)
        b, a = ba[:, : model.HV], ba[:, model.HV :]
        rla._linear_attention_with_output_impl(x, a, b, torch.empty(1, BUCKET, model.HV, model.V), layer, fb)
        if nan_after:
            for t in (x, ba):
                t.fill_(float("nan"))
    assert fb.out_cache_loc is loc
    return loc


@pytest.mark.parametrize("breakable", [True, False], ids=["breakable", "runner-scope-only"])
@pytest.mark.parametrize("real", [BUCKET, 300, 40])
def test_a_prefill_in_a_breakable_graph_keeps_every_records_row(radix_adapter, monkeypatch, real, breakable):
    """The forward's real tokens keep their records and kept interval states, each layer's inputs written during its
    own break: after every break nothing is held, and what the segments write into the reused pool after it (NaN
    here) reaches no record. (The forward's rows are found by the view ``out_cache_loc`` narrows to, not its object.)
    ``real == BUCKET``: a prefill that fills its bucket, as every full chunk of a prompt longer than
    ``chunked_prefill_size`` (the largest default bucket) does; there ``a``, ``b`` could be held."""
    from sglang.srt.layers import radix_linear_attention as rla
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
        enable_breakable_cuda_graph,
    )
    from sglang.srt.model_executor.runner_utils.prefill_graph import prefill_graph_scope

    monkeypatch.setattr(cap, "_wanted", lambda *_: True)  # the ring's presence is not what is tested
    with _setup(3, OpCounter(), stacked=True) as (model, req_pool, layers, backend, pool, gen):
        breaks = _Breaks(backend, torch.zeros(4, model.HV, model.V, model.K), gen, model)
        monkeypatch.setattr(rla, "get_attn_backend", lambda: breaks)
        # the prefill runner's scope and the breakable graph's (prefill_cuda_graph_runner.py, breakable backend); the
        # runner's alone: a piecewise graph's, whose layers run between pieces too
        graph = enable_breakable_cuda_graph() if breakable else contextlib.nullcontext()
        with prefill_graph_scope(full_graph=False), graph:
            _forward(rla, breaks, pool, layers, model, gen, real, nan_after=True)  # the layers' records are made
            loc = _forward(rla, breaks, pool, layers, model, gen, real, nan_after=True)
        tokens = loc[:real]
        assert pool.covered(tokens)
        slots = pool.slots(tokens)
        for layer, (x, a, b, _) in zip(layers, breaks.inputs):
            rec = pool.layers[layer.layer_id]
            assert torch.equal(rec.x[slots], x) and torch.equal(rec.a[slots], a) and torch.equal(rec.b[slots], b)
        assert breaks.held_after_layer == [0, 0, 0]
        kept, chunks = kept_positions([0], [real], pool.states.interval, pool.states.chunk)
        if kept:
            keys = loc[torch.tensor(kept, dtype=torch.long)]
            assert bool((pool.states.state_of[keys] >= 0).all())
            rows = pool.states.dest_of(keys)
            for layer, (_, _, _, h) in zip(layers, breaks.inputs):
                kept_rows = pool.states.ssm[layer.layer_id]
                assert torch.equal(kept_rows[rows], h[torch.tensor(chunks)].to(kept_rows.dtype))


def test_outside_a_breakable_graph_a_forward_still_stages_its_gate_inputs(radix_adapter, monkeypatch):
    """An eager forward through the same body (SGLang narrows it too where DP pads the batch) keeps writing every
    layer's ``a``, ``b`` in one op at its last layer: the break rule is the graph's alone."""
    from sglang.srt.layers import radix_linear_attention as rla

    monkeypatch.setattr(cap, "_wanted", lambda *_: True)
    with _setup(3, OpCounter(), stacked=True) as (model, req_pool, layers, backend, pool, gen):
        breaks = _Breaks(backend, torch.zeros(4, model.HV, model.V, model.K), gen, model)
        monkeypatch.setattr(rla, "get_attn_backend", lambda: breaks)
        _forward(rla, breaks, pool, layers, model, gen, BUCKET, nan_after=False)
        loc = _forward(rla, breaks, pool, layers, model, gen, BUCKET, nan_after=False)
        assert breaks.held_after_layer == [1, 2, 0] and pool.covered(loc)
        slots = pool.slots(loc)
        for layer, (x, a, b, _) in zip(layers, breaks.inputs):
            rec = pool.layers[layer.layer_id]
            assert torch.equal(rec.x[slots], x) and torch.equal(rec.a[slots], a) and torch.equal(rec.b[slots], b)

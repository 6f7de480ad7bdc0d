"""Records (``radix/records/pool.py``) and the rebuild of a state from them (``radix/records/rebuild.py``).

The rebuild runs SGLang's own prefill kernels (``causal_conv1d_fn`` under the Triton interpreter,
the GDN extend kernel = the CPU runtime's chunk stand-in) into SGLang's real decode-ring pool, and
is checked against the fp64 recurrence of the whole token path, at unaligned depths, spans shorter
than the conv kernel, spans crossing a 64-token chunk, and several rebuilds batched in one call.
"""

from __future__ import annotations

import types

import pytest
import torch

from sglang_replayssm.kernels.naive import (
    compute_beta_fp64,
    compute_gate_fp64,
    recurrence_fp64,
    unpack_mixed_qkv,
)
from sglang_replayssm.radix.records.match import Rebuild
from sglang_replayssm.radix.records.pool import RecordPool, capacity_from_env
from sglang_replayssm.radix.records.rebuild import rebuild
from tests.support.simulate import SimConfig, ToyModel, build_fixture


def test_assign_invalidate_and_first_in_first_out():
    pool = RecordPool(kv_size=20, capacity=4, device=torch.device("cpu"))
    kv = torch.tensor([3, 7, 9])
    assert not pool.covered(kv)
    pool.assign(kv)
    assert pool.covered(kv) and pool.slots(kv).tolist() == [0, 1, 2]
    pool.invalidate(torch.tensor([7]))  # KV index 7 handed to a new token
    assert not pool.covered(kv) and pool.covered(torch.tensor([3, 9]))
    pool.assign(torch.tensor([11, 12]))  # slots 3, 0: token 3 loses its record
    assert pool.slots(torch.tensor([11, 12])).tolist() == [3, 0]
    assert not pool.covered(torch.tensor([3])) and pool.covered(torch.tensor([9, 11, 12]))
    pool.assign(torch.tensor([7]))  # slot 1: its old owner (7) was invalidated, 7 now owns it
    assert pool.slots(torch.tensor([7])).tolist() == [1] and pool.covered(torch.tensor([9]))
    pool.assign(torch.arange(13, 19))  # more than the capacity: the last 4 keep records
    assert pool.covered(torch.arange(15, 19)) and not pool.covered(torch.tensor([13]))
    assert not pool.covered(torch.tensor([9, 11, 12, 7]).view(-1)[:1])
    assert pool.covered(torch.tensor([], dtype=torch.int64)) and not pool.covered(None)


def test_capacity_from_env(monkeypatch):
    monkeypatch.delenv("SGLANG_REPLAYSSM_RECORD_TOKENS", raising=False)
    assert capacity_from_env(123) == 123 and capacity_from_env() == capacity_from_env(1 << 30) == 16384
    assert capacity_from_env(1 << 30, reserved=700) == 700 and capacity_from_env(123, reserved=700) == 123
    assert capacity_from_env(reserved=0) == 0  # the budget left no room: records off
    monkeypatch.setenv("SGLANG_REPLAYSSM_RECORD_TOKENS", "0")
    assert capacity_from_env(123) == 0
    monkeypatch.setenv("SGLANG_REPLAYSSM_RECORD_TOKENS", "500")
    assert capacity_from_env(123) == 123 and capacity_from_env() == 500 == capacity_from_env(reserved=700)
    for bad in ("-1", "many"):
        monkeypatch.setenv("SGLANG_REPLAYSSM_RECORD_TOKENS", bad)
        with pytest.raises(ValueError, match="SGLANG_REPLAYSSM_RECORD_TOKENS"):
            capacity_from_env(123)


def _layer(model: ToyModel, layer_id: int, gen: torch.Generator) -> types.SimpleNamespace:
    D = model.qkv_dim
    return types.SimpleNamespace(
        layer_id=layer_id, conv_weights=0.4 * torch.randn(D, model.win + 1, generator=gen),
        bias=0.1 * torch.randn(D, generator=gen), activation="silu",
        A_log=torch.log(0.2 + 0.6 * torch.rand(model.HV, generator=gen)),
        dt_bias=0.1 * torch.randn(model.HV, generator=gen),
        q_dim=model.H * model.K, k_dim=model.H * model.K, v_dim=model.HV * model.V,
        num_q_heads=model.H, num_k_heads=model.H, num_v_heads=model.HV,
        head_q_dim=model.K, head_k_dim=model.K, head_v_dim=model.V,
    )


def _backend() -> types.SimpleNamespace:
    """SGLang's GDN gates and, as the extend kernel, what ``TritonGDNKernel.extend`` calls on the CPU
    engine (this test process is not one, so SGLang would pick FLA's GPU chunk kernel)."""
    from sgl_kernel.mamba import chunk_gated_delta_rule_cpu
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

    def extend(q, k, v, g, beta, *, ssm_states, cache_indices, query_start_loc, **unused):
        return chunk_gated_delta_rule_cpu(q=q, k=k, v=v, g=g, beta=beta, initial_state=ssm_states,
                                          cu_seqlens=query_start_loc, head_first=False,
                                          use_qk_l2norm_in_kernel=True, initial_state_indices=cache_indices)

    return types.SimpleNamespace(_prefill_gates=GDNAttnBackend._prefill_gates,
                                 kernel_dispatcher=types.SimpleNamespace(extend=extend),
                                 requires_contiguous_prefill_state=False)


def _oracle(layer, model, x, a, b, n, kda=False):
    """fp64 state after the first ``n`` tokens (conv + SiLU, gates, gated delta rule from zero);
    KDA: ``a`` rows are per channel ``[HV * K]``."""
    w = layer.conv_weights.double()
    xp = torch.cat([torch.zeros(model.win, x.shape[1], dtype=torch.float64), x[:n].double()])
    conv = torch.stack([(xp[t:t + model.win + 1].T * w).sum(-1) for t in range(n)]) + layer.bias.double()
    conv = conv * torch.sigmoid(conv)
    q, k, v = unpack_mixed_qkv(conv, model.H, model.K, model.HV, model.V)
    if kda:
        g = compute_gate_fp64(a[:n].reshape(n, model.HV, model.K), layer.A_log,
                              layer.dt_bias.reshape(model.HV, model.K), is_kda=True)
    else:
        g = compute_gate_fp64(a[:n], layer.A_log, layer.dt_bias, is_kda=False)
    beta = compute_beta_fp64(b[:n])
    state = torch.zeros(1, model.HV, model.V, model.K, dtype=torch.float64)
    _, final = recurrence_fp64(state, q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None])
    return final[0]


@pytest.mark.parametrize("spans", [
    [(0, 1), (0, 2), (5, 6), (7, 9), (0, 70)],  # spans shorter than the conv kernel, from the root
    [(37, 101), (64, 130), (3, 200), (130, 131)],  # unaligned depths, crossing a 64-token chunk
])
def test_rebuild_matches_the_fp64_recurrence(spans, radix_adapter):
    model, req_pool, layers, backend, pool, kv, inputs = _setup_rebuild(max(n for _, n in spans), seed=7)
    jobs = _tree_jobs(model, req_pool, layers, inputs, pool, kv, spans)
    rebuild(pool, req_pool, jobs)
    _check(model, req_pool, layers, inputs, jobs, [n for _, n in spans])


def _tree_jobs(model, req_pool, layers, inputs, pool, kv, spans, oracle=None, kda=False):
    """One rebuild per ``(s, n)``: from the root (s = 0) or from a tree state at ``s`` (the exact
    fp64 state, stored fp32, and the window at s), folding the records of tokens s..n-1."""
    jobs = []
    alloc = req_pool.mamba_allocator
    for s, n in spans:
        src = None
        if s > 0:
            src = alloc.alloc(1)
            for layer, (x, a, b) in zip(layers, inputs):
                cache = req_pool.mamba2_layer_cache(layer.layer_id)
                cache.temporal[src] = (oracle or _oracle)(layer, model, x, a, b, s).float()
                window = torch.cat([torch.zeros(model.win, x.shape[1]), x[:s]])[-model.win:]
                cache.conv[0][src] = window if kda else window.T
        jobs.append(Rebuild(dst=alloc.alloc(1), src=src, slots=pool.slots(kv[s:n])))
    return jobs


def test_kept_positions_follow_the_chunk_grid():
    from sglang_replayssm.radix.records.interval_states import kept_positions

    # One 1,088-token prompt from the root: chunk starts 64..1024; the state interval 256 keeps
    # depths 256, 512, 768, 1024 (after tokens 255, 511, 767, 1023; chunks 4, 8, 12, 16).
    assert kept_positions([0], [1088], 256) == ([255, 511, 767, 1023], [4, 8, 12, 16])
    # Unaligned prefix 100: chunk starts at depths 164, 228, 292, ...; the first past 256 is 292.
    tokens, chunks = kept_positions([100], [300], 256)
    assert tokens == [191] and chunks == [3]
    # Two sequences: the second's tokens and chunks are offset by the first's (70 tokens, 2 chunks).
    assert kept_positions([0, 0], [70, 300], 128) == ([70 + 127, 70 + 255], [2 + 2, 2 + 4])
    # No interior chunk start, or states off.
    assert kept_positions([0], [64], 64) == ([], []) and kept_positions([0], [1000], 0) == ([], [])


def test_interval_states_first_in_first_out_and_invalidate():
    from sglang_replayssm.radix.records.interval_states import IntervalStates

    st = IntervalStates(kv_size=20, capacity=2, interval=64, device=torch.device("cpu"))
    st.assign(torch.tensor([4, 9]))
    assert st.deepest(torch.tensor([1, 4, 5, 9, 6])) == (3, 1)
    st.invalidate(torch.tensor([9]))
    assert st.deepest(torch.tensor([1, 4, 5, 9, 6])) == (1, 0)
    st.assign(torch.tensor([11, 12]))  # slots 0, 1: key 4 loses its state
    assert st.deepest(torch.tensor([4, 5])) is None and st.deepest(torch.tensor([12, 3])) == (0, 1)
    st.write(0, torch.tensor([11, 3]), torch.arange(3.0).view(3, 1, 1, 1), torch.tensor([2, 1]), torch.float32)
    assert st.ssm[0][:, 0, 0, 0].tolist() == [2.0, 0.0, 1.0]  # key 3 has no slot: the sink row
    st.write(1, torch.tensor([11]), torch.zeros(1, 1, 1, 1, dtype=torch.bfloat16), torch.tensor([0]), torch.float32)
    assert 1 in st.skipped and not st.usable([0, 1]) and 1 not in st.ssm


def test_rounded_interval_states_keep_the_activation_dtype_as_computed():
    """With ``rounded``, a bf16 ``h`` (bf16 serving) is kept in bf16 as computed (half an fp32 state's bytes): the
    kept state is the bf16 value exactly (one rounding), and the layer stays usable; without it the layer keeps
    nothing. An ``h`` in the state dtype is kept in it either way."""
    from sglang_replayssm.radix.records.interval_states import IntervalStates

    h = (torch.arange(6.0) / 3).view(2, 3, 1, 1).to(torch.bfloat16)
    for rounded in (False, True):
        st = IntervalStates(kv_size=8, capacity=2, interval=64, device=torch.device("cpu"), rounded=rounded)
        st.assign(torch.tensor([5, 6]))
        st.write(0, torch.tensor([5]), h.view(2, 3, 1), torch.tensor([1]), torch.float32)
        assert st.usable([0]) is rounded
        if rounded:
            assert st.ssm[0].dtype == torch.bfloat16 and torch.equal(st.ssm[0][0], h.view(2, 3, 1)[1])
            assert st.nbytes == st.state_of.numel() * 8 + st.owner.numel() * 8 + 3 * 3 * 2  # 3 rows of 3 bf16
        st.write(1, torch.tensor([6]), h.view(2, 3, 1).float(), torch.tensor([0]), torch.float32)
        assert st.ssm[1].dtype == torch.float32 and torch.equal(st.ssm[1][1], h.view(2, 3, 1)[0].float())


def test_rounded_interval_states_follow_the_setting(monkeypatch):
    from sglang_replayssm import settings

    assert settings.STATE_INTERVAL_ROUNDED.value() is True  # default: rounded states kept (KL measured)
    monkeypatch.setenv(settings.STATE_INTERVAL_ROUNDED.name, "0")
    assert settings.STATE_INTERVAL_ROUNDED.value() is False


def _setup_rebuild(T: int, seed: int = 7, kind: str = "gdn"):
    """SGLang's real pools for a 2-layer toy model, and a record pool holding ``T`` tokens' random
    inputs at scattered KV indices (KDA: the gate as the extend passes it, ``[1, T, H, K]``)."""
    from sglang_replayssm.radix.records.capture import _token_rows

    cfg = SimConfig(kind=kind, strategy="extra_buffer", mamba_layers=2, head_dim=16, mamba_slots=24)
    model = ToyModel(cfg)
    _, _, req_pool = build_fixture(cfg, model)
    gen = torch.Generator().manual_seed(seed)
    kda = kind == "kda"
    layers = [(_kda_layer if kda else _layer)(model, i, gen) for i in range(cfg.mamba_layers)]
    backend = _kda_backend() if kda else _backend()
    pool = RecordPool(kv_size=512, capacity=320, device=torch.device("cpu"))
    kv = torch.randperm(500, generator=gen)[:T]
    pool.assign(kv)
    inputs = []
    for layer in layers:
        x = torch.randn(T, model.qkv_dim, generator=gen)
        if kda:
            a = _token_rows(0.5 * torch.randn(1, T, model.HV, model.K, generator=gen))
            b = _token_rows(torch.randn(1, T, model.HV, generator=gen))
        else:
            a, b = 0.5 * torch.randn(T, model.HV, generator=gen), torch.randn(T, model.HV, generator=gen)
        pool.write(layer, backend, kv, x, a, b)
        inputs.append((x, a, b))
    return model, req_pool, layers, backend, pool, kv, inputs


def _check(model, req_pool, layers, inputs, jobs, want, oracle=None, kda=False):
    """Each job's state equals the fp64 recurrence of its path (rel. <= 1e-5) and its conv window
    the path's last inputs, bit for bit (GDN pool layout [dim, W - 1], KDA [W - 1, dim])."""
    for job, n in zip(jobs, want):
        for layer, (x, a, b) in zip(layers, inputs):
            cache = req_pool.mamba2_layer_cache(layer.layer_id)
            ref = (oracle or _oracle)(layer, model, x, a, b, n)
            got = cache.temporal[job.dst[0]].double()
            assert (got - ref).norm() / ref.norm() <= 1e-5, (n, layer.layer_id)
            window = torch.cat([torch.zeros(model.win, x.shape[1]), x[:n]])[-model.win:]
            assert torch.equal(cache.conv[0][job.dst[0]], window if kda else window.T), (n, layer.layer_id)


def test_rebuild_from_interval_states_matches_the_fp64_recurrence(radix_adapter):
    """Interval-state starts (lead records make the conv window; spans of 0, 1, many records), batched
    with a start from a tree state and one from the root."""
    from sglang_replayssm.radix.records.interval_states import IntervalStates

    model, req_pool, layers, backend, pool, kv, inputs = _setup_rebuild(300)
    lead = model.win
    assert pool.conv_lead == lead
    pool.states = IntervalStates(kv_size=512, capacity=8, interval=64, device=torch.device("cpu"))
    alloc = req_pool.mamba_allocator
    starts = {64: 0, 128: 1, 5: 2, 256: 3}  # depth -> state slot
    for depth, slot in starts.items():
        pool.states.owner[slot] = kv[depth - 1]
        pool.states.state_of[kv[depth - 1]] = slot
        for layer, (x, a, b) in zip(layers, inputs):
            ssm = pool.states.ssm.setdefault(layer.layer_id, torch.zeros(9, model.HV, model.V, model.K))
            ssm[slot] = _oracle(layer, model, x, a, b, depth).float()
    jobs, want = [], []
    for t, n in ((64, 64), (64, 65), (128, 191), (5, 299), (256, 300)):
        jobs.append(Rebuild(dst=alloc.alloc(1), src=None, slots=pool.slots(kv[t - lead:n]), state=starts[t],
                            lead=lead))
        want.append(n)
    jobs.append(Rebuild(dst=alloc.alloc(1), src=None, slots=pool.slots(kv[:40])))
    want.append(40)
    rebuild(pool, req_pool, jobs)
    _check(model, req_pool, layers, inputs, jobs, want)


def _kda_layer(model: ToyModel, layer_id: int, gen: torch.Generator) -> types.SimpleNamespace:
    layer = _layer(model, layer_id, gen)
    layer.dt_bias = 0.1 * torch.randn(model.HV * model.K, generator=gen)
    layer.lower_bound = None
    return layer


def _kda_backend() -> object:
    """What ``KDAAttnBackend`` calls on the CPU runtime: the KDA chunk prefill stand-in."""
    from sglang_replayssm.cpu.kda import chunk_kda

    class KDAAttnBackend:  # the record pool tells KDA layers by their backend's class name
        kernel_dispatcher = types.SimpleNamespace(
            extend=lambda q, k, v, g, beta, *, ssm_states, cache_indices, query_start_loc, A_log, dt_bias,
            beta_is_raw, **unused: chunk_kda(q, k, v, g, beta, ssm_states=ssm_states, cache_indices=cache_indices,
                                             query_start_loc=query_start_loc, A_log=A_log, dt_bias=dt_bias,
                                             beta_is_raw=beta_is_raw, return_intermediate_states=False,
                                             track_state=None, track_chunk_idx=None))

    return KDAAttnBackend()


def _kda_oracle(layer, model, x, a, b, n):
    return _oracle(layer, model, x, a, b, n, kda=True)


def test_kda_rebuild_matches_the_fp64_recurrence(radix_adapter):
    """KDA records (per-channel gate inputs, the pool's [W - 1, dim] conv windows) rebuilt with the
    CPU runtime's KDA kernels, from the root and from a tree state, batched."""
    model, req_pool, layers, backend, pool, kv, inputs = _setup_rebuild(150, seed=11, kind="kda")
    assert all(rec.kda and rec.a.shape[1] == model.HV * model.K for rec in pool.layers.values())
    spans = [(0, 2), (0, 70), (37, 101), (64, 150)]
    jobs = _tree_jobs(model, req_pool, layers, inputs, pool, kv, spans, oracle=_kda_oracle, kda=True)
    want = [n for _, n in spans]
    rebuild(pool, req_pool, jobs)
    _check(model, req_pool, layers, inputs, jobs, want, oracle=_kda_oracle, kda=True)


def test_state_interval_from_env(monkeypatch):
    from sglang_replayssm.radix.records.interval_states import DEFAULT_INTERVAL, interval_from_env

    monkeypatch.delenv("SGLANG_REPLAYSSM_STATE_INTERVAL", raising=False)
    assert interval_from_env() == DEFAULT_INTERVAL == 256
    for good in ("0", "64", "1024"):
        monkeypatch.setenv("SGLANG_REPLAYSSM_STATE_INTERVAL", good)
        assert interval_from_env() == int(good)
    for bad, why in (("100", "multiple of 64"), ("-64", ">= 0"), ("often", "number of tokens")):
        monkeypatch.setenv("SGLANG_REPLAYSSM_STATE_INTERVAL", bad)
        with pytest.raises(ValueError, match=f"SGLANG_REPLAYSSM_STATE_INTERVAL.*{why}"):
            interval_from_env()


@pytest.mark.parametrize("algorithm", ["NONE", "NEXTN"])
def test_spec_decode_round_keeps_prompt_records(algorithm):
    """SGLang's spec ``prepare_for_decode`` leaves ``out_cache_loc`` as the prefill left it
    (schedule_batch.py:3754-3762; ``filter_batch`` returns early when it keeps every request, :3859-3861).
    The decode hook must not hand those (already written) prompt tokens new, unwritten record slots:
    with ``record_spec_decode`` off the prompt's records read back as zeros (the mtp-fit bench's wrong
    tokens after 32-token record hits, 2026-12-01). A non-speculative decode's ``out_cache_loc`` is its
    own fresh tokens, which do get slots."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_replayssm.radix import config
    from sglang_replayssm.radix.records.capture import assign_batch
    from sglang_replayssm.radix.records.pool import attach

    req_pool = types.SimpleNamespace()
    pool = attach(req_pool, RecordPool(kv_size=64, capacity=32, device=torch.device("cpu")))
    spec = SpeculativeAlgorithm.from_string(algorithm)
    prompt = torch.arange(5, 13)  # the prefill's KV indices
    batch = types.SimpleNamespace(req_to_token_pool=req_pool, token_to_kv_pool_allocator=None,
                                  out_cache_loc=prompt, prefix_lens=[0], extend_lens=[8], spec_algorithm=spec)
    assign_batch(batch, decode=False)
    layer = types.SimpleNamespace(layer_id=0)
    x, a, b = torch.randn(8, 6), torch.randn(8, 2), torch.randn(8, 2)
    pool.write(layer, types.SimpleNamespace(), prompt, x, a, b)  # the prefill forward's capture
    rec = pool.layers[0]

    def prompt_rows_intact() -> bool:
        slots = pool.slots(prompt)
        return bool((slots >= 0).all()) and torch.equal(rec.x[slots], x) and torch.equal(rec.a[slots], a)

    assert prompt_rows_intact()
    if algorithm == "NONE":  # a plain decode allocates fresh KV for its out_cache_loc
        batch.out_cache_loc = torch.tensor([20])
        assign_batch(batch, decode=True)
        assert pool.covered(torch.tensor([20])) and prompt_rows_intact()
        return
    for fix_on in (True, False):
        with config.override(record_spec_decode=fix_on):
            assign_batch(batch, decode=True)  # out_cache_loc: still the prefill's (stale)
        assert prompt_rows_intact() == fix_on


def test_a_forwards_extend_context_rides_on_its_dispatcher(monkeypatch):
    """``extending`` hands the step's (pool, layer, batch) to the extend hook through the backend's kernel
    dispatcher's state, only inside the forward's own extend of lengths that keep chunk states; another dispatcher
    (or after exit, or a forward that keeps none) sees none."""
    from sglang_replayssm.radix.records import capture as record_capture
    from sglang_replayssm.state import peek

    pool = types.SimpleNamespace(states=types.SimpleNamespace(interval=256, chunk=64), capture_decode=False,
                                 dest_of=lambda kv: kv, invalidate=lambda kv: None)
    monkeypatch.setattr(record_capture, "pool_of", lambda req_pool: pool)
    monkeypatch.setattr(record_capture, "_wanted", lambda backend, fb: True)
    dispatcher, other = types.SimpleNamespace(), types.SimpleNamespace()
    backend = types.SimpleNamespace(req_to_token_pool=None, kernel_dispatcher=dispatcher)

    def forward(tokens: int = 300) -> types.SimpleNamespace:
        return types.SimpleNamespace(out_cache_loc=torch.arange(tokens), extend_prefix_lens_cpu=[0],
                                     extend_seq_lens_cpu=[tokens],
                                     forward_mode=types.SimpleNamespace(is_decode=lambda: False))

    layer, fb = object(), forward()
    with record_capture.extending(backend, layer, fb):
        state = peek(dispatcher)
        assert state is not None and state.extending == (pool, layer, fb) and peek(other) is None
    assert state.extending is None
    with record_capture.extending(backend, layer, forward(256)):  # chunks start at 64, 128, 192: no interval crossed
        assert state.extending is None
    monkeypatch.setattr(record_capture, "_wanted", lambda backend, fb: False)
    with record_capture.extending(backend, layer, forward()):  # a forward that captures nothing
        assert state.extending is None


def test_capture_finds_the_record_rows_once_per_forward(monkeypatch):
    """Every GDN layer of one forward writes its tokens to the same record rows: they are gathered at the
    forward's first layer only, and a new forward (a new ``out_cache_loc``) gathers again."""
    from sglang_replayssm.radix.records import capture as cap

    pool = RecordPool(kv_size=32, capacity=8, device=torch.device("cpu"))
    calls = []
    real = pool.dest_of
    monkeypatch.setattr(pool, "dest_of", lambda kv: calls.append(kv) or real(kv))
    monkeypatch.setattr(cap, "pool_of", lambda _: pool)
    monkeypatch.setattr(cap, "_wanted", lambda *_: True)
    backend = types.SimpleNamespace(req_to_token_pool=None)
    mode = types.SimpleNamespace(is_decode=lambda: False)
    for step in range(2):
        loc = torch.tensor([3, 7, 11]) + step
        pool.assign(loc)
        batch = types.SimpleNamespace(out_cache_loc=loc, forward_mode=mode)
        for layer_id in range(3):
            x = torch.full((3, 4), float(10 * step + layer_id))
            cap.capture(backend, types.SimpleNamespace(layer_id=layer_id), batch, x, torch.zeros(3, 2),
                        torch.zeros(3, 2))
        assert len(calls) == step + 1  # one gather per forward, not per layer
        rows = real(loc)
        for layer_id in range(3):
            assert torch.equal(pool.layers[layer_id].x[rows], torch.full((3, 4), float(10 * step + layer_id)))

"""Rebuild planted states from records, at the start of the next forward (before SGLang's
deferred copy-on-write reads them).

For each queued :class:`record_match.Rebuild` (``dst`` a fresh tree slot, its start: an interval
state, or ``src`` the ancestor's state or the zero state; ``slots`` the records of the span): ``dst``
gets the start state (an exact copy, :func:`snapshot.copy_from_exact`, or the kept interval state,
whose conv window the first ``lead`` records make), then every GDN layer runs SGLang's own prefill kernels over
the stored inputs, all rebuilds of the step batched as one varlen sequence set: ``causal_conv1d_fn``
with ``dst``'s conv window as the initial window, the layer's gates, and the extend kernel of its
backend (``GDNKernelDispatcher.extend``), which leaves the state after the span in ``temporal[dst]``
and the conv window of the span's last three inputs in ``conv[dst]``. That is what a prefill from
``src``'s depth computes, with the same kernels, so the result is as exact as SGLang's prefill.

Short spans (every span of the step at most ``pool.sequential_tokens`` records, CUDA only) of a fold that is
not stacked (KDA layers, pools whose states are not one stack) run the recurrence through SGLang's Triton
decode kernel instead (``fused_sigmoid_gating_delta_rule_update``, what ``TritonGDNKernel.decode`` and KDA's
Triton decode call, whatever decode backend the server uses: the CuTe DSL / FlashInfer decode kernels take one
token per sequence), varlen over the spans, gates fused in, the state updated in place in fp32 token by token:
two launches per layer instead of the chunk pipeline's dozen, for the same state (closer to fp64: no bf16
tensor-core operands). A stacked chunk fold launches its few dozen ops once for every layer (42 against the
sequential fold's 8 + 8 a layer, counted on CPU: ``lab/scripts/count_rebuild_paths.py``), so stacked GDN folds
always take it. The CPU runtime's decode kernel takes one token per sequence, so CPU pools keep the chunk
path.

Per step, not per layer: the plan's index tensors, the start states' copy into every layer's slot and every
layer's ``a``, ``b`` gather, where the pool keeps them as stacks (:func:`~.startup.prepare_layers`), and for
GDN chunk folds over the mamba pool's state stack the gates and the extend (:mod:`.fold_stack`); per layer
only the layer's ``x`` gather, its conv and the conv rows past the lead (elsewhere also its gates and extend).

Runs on the forward thread before the forward's first write, so every slot it reads (``src``, the
records) still holds what the match saw: writes to pool slots and record slots happen only in
forwards, and rebuilds queued by a match run before the next one (``ModelRunner.forward``).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from sglang_replayssm import settings
from sglang_replayssm.host_lists import on_device, on_device_many
from sglang_replayssm.radix.records.fold_stack import (
    StackedStates,
    conv_stacked,
    extend_stacked,
    gdn_extend,
    stacked_states,
)
from sglang_replayssm.radix.records.match import Rebuild
from sglang_replayssm.radix.records.pool import LayerRecords, RecordPool, pool_of
from sglang_replayssm.radix.records.warmup import warm_up

__all__ = ["DEFAULT_SEQUENTIAL_TOKENS", "SEQUENTIAL_ENV", "rebuild", "run_pending", "sequential_tokens_from_env"]

SEQUENTIAL_ENV = settings.REBUILD_SEQUENTIAL_TOKENS.name
#: Longest span that folds token by token on CUDA (H200 crossover, docs/BENCHMARKS.md).
DEFAULT_SEQUENTIAL_TOKENS: int = settings.REBUILD_SEQUENTIAL_TOKENS.default


def _decode_kernel() -> Any:
    """SGLang's Triton recurrent (decode / verify) kernel."""
    from sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update,
    )

    return fused_sigmoid_gating_delta_rule_update


def _fold_sequential(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                     layer: Any, ssm_states: torch.Tensor, indices: torch.Tensor, cu: torch.Tensor,
                     is_kda: bool) -> None:
    """Fold the spans (``cu``) into ``ssm_states[indices]`` in place, with the arguments SGLang's Triton
    decode passes (q, k ``[1, T, H, K]``, v ``[1, T, HV, V]``; a raw gate rows, b raw beta rows)."""
    _decode_kernel()(
        A_log=layer.A_log, dt_bias=layer.dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=ssm_states,
        initial_state_indices=indices, cu_seqlens=cu, use_qk_l2norm_in_kernel=True, softplus_beta=1.0,
        softplus_threshold=20.0, is_kda=is_kda, lower_bound=getattr(layer, "lower_bound", None) if is_kda else None,
    )


def sequential_tokens_from_env() -> int:
    """``SGLANG_REPLAYSSM_REBUILD_SEQUENTIAL_TOKENS`` (0: always the chunk kernels), else the default."""
    return settings.REBUILD_SEQUENTIAL_TOKENS.value()


def run_pending(runner: Any) -> int:
    """Before ``ModelRunner.forward``: run the queued rebuilds; returns how many ran."""
    if getattr(runner, "is_draft_worker", False):
        return 0
    req_pool = getattr(runner, "req_to_token_pool", None)
    pool = pool_of(req_pool)
    if pool is None:
        return 0
    pool.settle()  # records a forward left half-written are dropped before anything reads them
    if not pool.warmed:
        warm_up(pool, req_pool, rebuild)
    if not pool.pending:
        return 0
    jobs, pool.pending = pool.pending, []
    rebuild(pool, req_pool, jobs)
    return len(jobs)


def rebuild(pool: RecordPool, req_pool: Any, jobs: list[Rebuild]) -> None:
    """Write into each job's ``dst`` its start state followed by the job's records."""
    if not jobs:
        return
    translate = req_pool.translate_mamba_indices
    copied = [j for j in jobs if j.src is not None]
    zeroed = [j for j in jobs if j.src is None and j.state is None]
    if copied:
        req_pool.copy_mamba_state(translate(torch.cat([j.src for j in copied])),  # type: ignore[misc]
                                  translate(torch.cat([j.dst for j in copied])))
    if zeroed:
        req_pool.mamba_pool.clear_slots(translate(torch.cat([j.dst for j in zeroed])))
    device = pool.device
    from_state = [j for j in jobs if j.state is not None]
    starts: tuple[torch.Tensor, torch.Tensor] | None = None  # (dst, src): interval states into pool slots
    if from_state and pool.states is not None:
        starts = (translate(torch.cat([j.dst for j in from_state])).to(device=device, dtype=torch.int64),
                  on_device([int(j.state) for j in from_state if j.state is not None], torch.int64, device))
    caches = {layer_id: req_pool.mamba2_layer_cache(layer_id) for layer_id in sorted(pool.layers)}
    ab = pool.stacked_ab()  # every layer's gate inputs, stacked
    stack = _stack_of(pool, caches) if ab is not None else None
    # Stacked, a chunk fold launches the same few ops for every layer at once; the sequential fold runs per layer.
    plan = _Plan.of(jobs, device, translate, 0 if stack is not None else pool.sequential_tokens)
    if starts is not None and _start_states_of_all_layers(pool, req_pool, caches, *starts):
        starts = None
    if starts is not None and pool.states is not None:  # layer by layer where not copied at once above
        for layer_id, cache in caches.items():
            cache.temporal[starts[0]] = pool.states.ssm[layer_id][starts[1]].to(cache.temporal.dtype)
    ab_ext = None if ab is None else _gate_rows(pool, ab, plan.ext_slots)
    if stack is not None and ab_ext is not None and plan.ext_lens:  # the convs, then one extend for every layer
        layers, xs = [pool.layers[lid].layer for lid in pool.layer_ids], pool.xs  # stacked where ``ab`` is
        if stack.conv is not None and xs is not None:  # one conv for every layer
            mixed: list[torch.Tensor] | torch.Tensor = conv_stacked(
                layers, xs, stack.conv, stack.rows, plan.slots, plan.dst, plan.conv_init, plan.conv_cu, plan.conv_lens)
        else:
            mixed = [_conv_gdn(pool.layers[lid], caches[lid].conv[0], plan.dst, plan, keep=False)
                     for lid in pool.layer_ids]
        extend_stacked(pool.layers[pool.layer_ids[0]].backend, layers, mixed, plan.keep, *ab_ext, stack, plan.ext_dst,
                       plan.ext_lens, plan.ext_prefix)
        return
    ab_rows = None if ab_ext is None else tuple(zip(ab_ext[0].unbind(0), ab_ext[1].unbind(0)))
    for layer_id, cache in caches.items():
        rec = pool.layers[layer_id]
        if ab_rows is None:
            a, b = rec.a[plan.ext_slots], rec.b[plan.ext_slots]
        else:
            a, b = ab_rows[pool.layer_ids.index(layer_id)]
        (_fold_kda_layer if rec.kda else _fold_gdn_layer)(rec, cache, plan, a, b)


def _gate_rows(pool: RecordPool, ab: tuple[torch.Tensor, torch.Tensor],
               slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer's ``a``, ``b`` rows at record ``slots`` (``[L, n, HV]`` each): one gather of
    :attr:`RecordPool.gate_stack` where the stacks are its halves, else one a stack."""
    if pool.gate_stack is not None:
        gates = pool.gate_stack.index_select(2, slots)
        return gates[0], gates[1]
    return ab[0].index_select(1, slots), ab[1].index_select(1, slots)


def _stack_of(pool: RecordPool, caches: dict[int, Any]) -> StackedStates | None:
    """The mamba pool's state stack when a chunk fold's extend can run once for every layer over it
    (:mod:`.fold_stack`): GDN layers of one backend, used in place, whose states are rows of one stack; else None."""
    recs = [pool.layers[lid] for lid in caches]
    if any(r.kda for r in recs) or len({id(r.backend) for r in recs}) != 1:
        return None
    if any(_needs_work_copies(r.backend, c.conv[0], c.temporal) for r, c in zip(recs, caches.values())):
        return None
    return stacked_states(caches)


def _needs_work_copies(backend: Any, conv_states: torch.Tensor, ssm_states: torch.Tensor) -> bool:
    """As SGLang's ``forward_extend``: kernels that need a contiguous slot layout get gathered work copies
    of pools that are not (never on CPU)."""
    from sglang.srt.utils import is_cpu

    return (getattr(backend, "requires_contiguous_prefill_state", False) and not is_cpu()
            and (not conv_states.is_contiguous() or not ssm_states.is_contiguous()))


def _start_states_of_all_layers(pool: RecordPool, req_pool: Any, caches: dict[int, Any], dst: torch.Tensor,
                                src: torch.Tensor) -> bool:
    """Copy the interval states ``src`` into pool slots ``dst`` of every layer in one op: where the kept
    states are one stack (:meth:`IntervalStates.stacked`) whose row ``i`` is the mamba pool's layer ``i``
    (``mamba_cache.temporal [L, slots, *state]``), for exactly the layers with records. False: nothing
    copied (the caller copies layer by layer)."""
    states = pool.states
    stack = None if states is None else states.stacked()
    temporal = getattr(getattr(getattr(req_pool, "mamba_pool", None), "mamba_cache", None), "temporal", None)
    if stack is None or states is None or not isinstance(temporal, torch.Tensor) or list(caches) != sorted(
            states.layer_ids) or temporal.shape[0] != len(states.layer_ids):
        return False
    base = temporal if temporal._base is None else temporal._base
    for layer_id, row in zip(states.layer_ids, temporal.unbind(0)):  # row i: this layer's temporal, as a view
        own = caches[layer_id].temporal
        if own._base is not base or (own.storage_offset(), own.stride(), own.shape) != (
                row.storage_offset(), row.stride(), row.shape):
            return False
    temporal[:, dst] = stack[:, src].to(temporal.dtype)
    return True


class _Plan:
    """One step's rebuilds as varlen batches: the conv runs over every job's records (lead
    included), the extend over the records past each job's lead (jobs with none are left out);
    ``sequential``: every extended span has at most ``sequential_tokens`` records (decode kernel)."""

    def __init__(self, slots: torch.Tensor, conv_cu: torch.Tensor, conv_lens: list[int], dst: torch.Tensor,
                 conv_init: torch.Tensor, keep: torch.Tensor | None, ext_cu: torch.Tensor, ext_lens: list[int],
                 ext_rows: torch.Tensor, ext_init: torch.Tensor, sequential_tokens: int = 0) -> None:
        self.slots, self.conv_cu, self.conv_lens, self.dst, self.conv_init = slots, conv_cu, conv_lens, dst, conv_init
        self.keep, self.ext_cu, self.ext_lens, self.ext_init = keep, ext_cu, ext_lens, ext_init
        self.ext_rows = ext_rows  # the extended jobs' positions in the batch (rows of ``dst``)
        self.ext_slots = slots if keep is None else slots[keep]  # the extended records (their a, b rows)
        self.ext_dst = dst[ext_rows.long()]
        self.ext_prefix = ext_init.to(torch.int32)  # the extend's ``extend_prefix_lens`` flag, once per step
        self.sequential = bool(ext_lens) and max(ext_lens) <= sequential_tokens

    @classmethod
    def of(cls, jobs: list[Rebuild], device: torch.device, translate: Any, sequential_tokens: int = 0) -> _Plan:
        """The plan of ``jobs``; its host lists reach the device in one copy (:func:`on_device_many`)."""
        conv_lens = [int(j.slots.numel()) for j in jobs]
        dst = translate(torch.cat([j.dst for j in jobs])).to(device=device, dtype=torch.int32)
        keep_rows: list[int] = []
        start = 0
        for j, n in zip(jobs, conv_lens):
            keep_rows += range(start + j.lead, start + n)
            start += n
        ext = [i for i, (j, n) in enumerate(zip(jobs, conv_lens)) if n > j.lead]
        ext_lens = [conv_lens[i] - jobs[i].lead for i in ext]
        leads = any(j.lead for j in jobs)
        conv_cu, conv_init, keep, ext_cu, ext_rows, ext_init = on_device_many([
            ([0, *itertools.accumulate(conv_lens)], torch.int32),
            ([j.src is not None for j in jobs], torch.bool),
            (keep_rows if leads else [], torch.int64),
            ([0, *itertools.accumulate(ext_lens)], torch.int32),
            (ext, dst.dtype),
            ([jobs[i].src is not None or jobs[i].state is not None for i in ext], torch.bool),
        ], device)
        return cls(
            slots=torch.cat([j.slots for j in jobs]).to(device),
            conv_cu=conv_cu,
            conv_lens=conv_lens,
            dst=dst,
            conv_init=conv_init,
            keep=keep if leads else None,
            ext_cu=ext_cu,
            ext_lens=ext_lens,
            ext_rows=ext_rows,
            ext_init=ext_init,
            sequential_tokens=sequential_tokens,
        )


def _fold_gdn_layer(rec: LayerRecords, cache: Any, plan: _Plan, a: torch.Tensor, b: torch.Tensor) -> None:
    """Fold the plan's records of one GDN layer into its pool ``cache`` (``mamba2_layer_cache``); ``a``,
    ``b``: the layer's gate inputs of the extended records (``ext_slots``), gathered by the caller."""
    layer, backend = rec.layer, rec.backend
    conv_states, ssm_states = cache.conv[0], cache.temporal
    gather = _needs_work_copies(backend, conv_states, ssm_states)
    dst = plan.dst
    if gather:  # as SGLang's forward_extend: kernels that need a contiguous slot layout
        conv_work, ssm_work = conv_states[dst.long()].contiguous(), ssm_states[dst.long()].contiguous()
        idx = torch.arange(dst.numel(), device=dst.device, dtype=dst.dtype)
        ext_idx = plan.ext_rows  # the work copies are in batch order
    else:
        conv_work, ssm_work, idx, ext_idx = conv_states, ssm_states, dst, plan.ext_dst
    mixed = _conv_gdn(rec, conv_work, idx, plan)
    n = mixed.shape[0]
    if n > 0:
        q, k, v = torch.split(mixed, [layer.q_dim, layer.k_dim, layer.v_dim], dim=-1)
        q = q.reshape(1, n, layer.num_q_heads, layer.head_q_dim)
        k = k.reshape(1, n, layer.num_k_heads, layer.head_k_dim)
        v = v.reshape(1, n, layer.num_v_heads, layer.head_v_dim)
        if plan.sequential:  # from every dst slot's state (root spans: zeroed above)
            _fold_sequential(q, k, v, a, b, layer, ssm_work, ext_idx, plan.ext_cu, is_kda=False)
            return _scatter(gather, conv_states, ssm_states, dst, conv_work, ssm_work)
        g, beta = backend._prefill_gates(layer, a, b)
        gdn_extend(backend, q, k, v, g, beta, ssm_work, ext_idx, plan.ext_cu, layer.layer_id, plan.ext_prefix)
    _scatter(gather, conv_states, ssm_states, dst, conv_work, ssm_work)


def _conv_gdn(rec: LayerRecords, conv_states: torch.Tensor, idx: torch.Tensor, plan: _Plan,
              keep: bool = True) -> torch.Tensor:
    """The layer's conv over the plan's records (``conv_states[idx]``: each job's window, updated), its
    output rows ``[rows, q + k + v]``: with ``keep``, only those past the leads."""
    from sglang.srt.layers.attention.linear import gdn_backend  # its conv is the platform's

    layer = rec.layer
    x = rec.x[plan.slots]
    mixed = gdn_backend.causal_conv1d_fn(
        x.transpose(0, 1),
        layer.conv_weights,
        layer.bias,
        activation=layer.activation,
        conv_states=conv_states,
        has_initial_state=plan.conv_init,
        cache_indices=idx,
        query_start_loc=plan.conv_cu,
        seq_lens_cpu=plan.conv_lens,
    ).transpose(0, 1)[:x.shape[0]]
    return mixed if plan.keep is None or not keep else mixed[plan.keep]  # lead rows only made the conv window


def _scatter(gather: bool, conv_states: torch.Tensor, ssm_states: torch.Tensor, dst: torch.Tensor,
             conv_work: torch.Tensor, ssm_work: torch.Tensor) -> None:
    """Write gathered work copies back to their pool slots (a no-op when the pools were used in place)."""
    if gather:
        conv_states[dst.long()] = conv_work
        ssm_states[dst.long()] = ssm_work


def _fold_kda_layer(rec: LayerRecords, cache: Any, plan: _Plan, a: torch.Tensor, b: torch.Tensor) -> None:
    """As :func:`_fold_gdn_layer` with what ``KDAAttnBackend.forward_extend`` runs: the conv over the
    pool's ``[W - 1, dim]`` windows (Triton off CPU, the platform's CPU conv on it) and the KDA extend
    kernel with the raw per-channel gate and beta (the kernel applies ``A_log``, ``dt_bias``)."""
    from sglang.srt.layers.attention.linear import gdn_backend, kda_backend
    from sglang.srt.utils import is_cpu

    layer, backend = rec.layer, rec.backend
    conv_fn = gdn_backend.causal_conv1d_fn if is_cpu() else kda_backend.causal_conv1d_fn
    x = rec.x[plan.slots]
    total = x.shape[0]
    mixed = conv_fn(
        x.transpose(0, 1),
        layer.conv_weights,
        layer.bias,
        activation=getattr(layer, "activation", "silu"),  # Kimi's layers: "silu", what the backend passes
        conv_states=cache.conv[0].transpose(-1, -2),
        has_initial_state=plan.conv_init,
        cache_indices=plan.dst,
        query_start_loc=plan.conv_cu,
        seq_lens_cpu=plan.conv_lens,
    ).transpose(0, 1)[:total]
    if plan.keep is not None:
        mixed = mixed[plan.keep]
    n = mixed.shape[0]
    if n == 0:
        return
    q, k, v = mixed.split([layer.q_dim, layer.k_dim, layer.v_dim], dim=-1)
    q4 = q.unflatten(-1, (-1, layer.head_q_dim)).unsqueeze(0)
    k4 = k.unflatten(-1, (-1, layer.head_k_dim)).unsqueeze(0)
    v4 = v.unflatten(-1, (-1, layer.head_v_dim)).unsqueeze(0)
    a4 = a.unflatten(-1, (-1, layer.head_k_dim)).unsqueeze(0)
    if plan.sequential:  # raw per-channel gate and beta, as KDA's forward_decode passes them
        _fold_sequential(q4, k4, v4, a4, b, layer, cache.temporal, plan.ext_dst, plan.ext_cu, is_kda=True)
        return
    backend.kernel_dispatcher.extend(
        q=q4,
        k=k4,
        v=v4,
        g=a4,
        beta=b.unsqueeze(0),
        ssm_states=cache.temporal,
        cache_indices=plan.ext_dst,
        query_start_loc=plan.ext_cu,
        A_log=layer.A_log,
        dt_bias=layer.dt_bias,
        lower_bound=getattr(layer, "lower_bound", None),
        beta_is_raw=True,
        extend_seq_lens_cpu=plan.ext_lens,
        extend_prefix_lens=plan.ext_prefix,
        layer_id=layer.layer_id,
        is_spec_decode=False,
        return_intermediate_states=False,
        track_ssm_h_src=None,
        track_state=None,
        track_chunk_idx=None,
        state_checkpoint_cu_starts=None,
        num_state_checkpoints=0,
        state_checkpoint_every_n_tokens=0,
        state_checkpoint_indices=None,
        track_ssm_h_batch_src=None,
    )

"""Every GDN layer's extend of one rebuild step as one varlen call over the mamba pool's layer stack.

A rebuild folds the same spans into every GDN layer; only the inputs (each layer's conv output and gate
rows) and the layer's rows of the pool differ. Where the pool keeps its states as one contiguous stack
``temporal [L, slots, HV, V, K]`` (SGLang's ``MambaPool``; the per-layer caches are its rows), the
stack flattened to ``[L * slots, HV, V, K]`` holds every layer's slots, so the extend kernel runs once
with the sequences ``(layer, span)``, layer-major: state index ``row(layer) * slots + dst`` and the
layer's q, k, v, g, beta rows. The gates run once too, the layers side by side as heads
(``fused_gdn_gating`` is elementwise per head: ``A_log``, ``dt_bias`` of every layer concatenated).

Each sequence's recurrence reads and writes only its own state and rows, so the result is the per-layer
calls' (bit for bit where the kernel treats sequences independently, as SGLang's Triton chunk kernels
do). What stays per layer: the ``x`` gather and the conv (the layer's weights and conv window).
"""

from __future__ import annotations

import itertools
import types
from dataclasses import dataclass
from typing import Any

import torch

from sglang_replayssm.host_lists import on_device

__all__ = ["StackedStates", "extend_stacked", "gdn_extend", "stacked_states"]


@dataclass(frozen=True)
class StackedStates:
    """The pool's state stack flattened (``flat [L * slots, *state]``) and each layer's row in it."""

    flat: torch.Tensor
    slots: int
    rows: dict[int, int]


def stacked_states(caches: dict[int, Any]) -> StackedStates | None:
    """The stack behind every ``caches[layer_id].temporal`` (``mamba2_layer_cache`` rows of one
    contiguous ``[L, slots, *state]`` tensor), or None where the layers' states are not laid out so."""
    temporals: list[torch.Tensor] = [t for c in caches.values() if isinstance(t := getattr(c, "temporal", None),
                                                                            torch.Tensor)]
    if not temporals or len(temporals) != len(caches):
        return None
    base = temporals[0]._base
    if base is None or base.dim() != temporals[0].dim() + 1 or not base.is_contiguous():
        return None
    rows: dict[int, int] = {}
    for layer_id, t in zip(caches, temporals):
        row, rem = divmod(int(t.storage_offset()) - int(base.storage_offset()), int(base.stride(0)))
        if (t._base is not base or rem or not 0 <= row < base.shape[0] or t.shape != base.shape[1:]
                or t.stride() != base.stride()[1:]):
            return None
        rows[layer_id] = row
    return StackedStates(base.flatten(0, 1), base.shape[1], rows)


def extend_stacked(backend: Any, layers: list[Any], mixed: list[torch.Tensor], keep: torch.Tensor | None,
                   a: torch.Tensor, b: torch.Tensor, stack: StackedStates, ext_dst: torch.Tensor, ext_lens: list[int],
                   ext_prefix: torch.Tensor) -> None:
    """Fold every layer's extended rows into its states at ``ext_dst`` in one extend call.

    ``layers[i]``: the GDN layer of ``mixed[i]`` (its conv output ``[rows, q + k + v]``, of which ``keep``
    picks the extended rows, None: all) and of ``a[i]``, ``b[i]`` (``[L, n, HV]``, the gate inputs of the
    extended rows); ``ext_lens``: the spans' lengths (summing to ``n``), ``ext_dst`` their state slots,
    ``ext_prefix`` the extend's prefix flags."""
    first, L = layers[0], len(layers)
    n, hv = a.shape[1], a.shape[2]
    rows = torch.cat(mixed) if L > 1 else mixed[0]  # [L * rows, q + k + v], layer-major
    if keep is not None:  # every layer's extended rows in one gather
        per_layer = mixed[0].shape[0]
        rows = rows[(torch.arange(L, device=keep.device) * per_layer)[:, None].add(keep[None, :]).reshape(-1)]
    q, k, v = torch.split(rows, [first.q_dim, first.k_dim, first.v_dim], dim=-1)
    q = q.reshape(1, L * n, first.num_q_heads, first.head_q_dim)
    k = k.reshape(1, L * n, first.num_k_heads, first.head_k_dim)
    v = v.reshape(1, L * n, first.num_v_heads, first.head_v_dim)
    heads = types.SimpleNamespace(A_log=torch.cat([lay.A_log for lay in layers]),
                                  dt_bias=torch.cat([lay.dt_bias for lay in layers]))
    g, beta = backend._prefill_gates(heads, a.transpose(0, 1).reshape(n, L * hv), b.transpose(0, 1).reshape(n, L * hv))
    g = g.reshape(n, L, hv).transpose(0, 1).reshape(1, L * n, hv)
    beta = beta.reshape(n, L, hv).transpose(0, 1).reshape(1, L * n, hv)
    offsets = on_device([stack.rows[lay.layer_id] * stack.slots for lay in layers], ext_dst.dtype, ext_dst.device)
    indices = (offsets[:, None] + ext_dst[None, :]).reshape(-1)
    ends = list(itertools.accumulate(ext_lens))
    cu = on_device([0] + [i * n + e for i in range(L) for e in ends], torch.int32, ext_dst.device)
    gdn_extend(backend, q, k, v, g, beta, stack.flat, indices, cu, first.layer_id, ext_prefix.repeat(L))


def gdn_extend(backend: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               ssm_states: torch.Tensor, indices: torch.Tensor, cu: torch.Tensor, layer_id: int,
               prefix: torch.Tensor) -> None:
    """SGLang's GDN extend kernel (``backend.kernel_dispatcher.extend``) over the varlen sequences ``cu``
    from and into ``ssm_states[indices]``, as a prefill without tracked or checkpointed states calls it."""
    backend.kernel_dispatcher.extend(
        q=q, k=k, v=v, g=g, beta=beta, ssm_states=ssm_states, cache_indices=indices, query_start_loc=cu,
        state_checkpoint_cu_starts=None, num_state_checkpoints=0, state_checkpoint_every_n_tokens=0, output=None,
        layer_id=layer_id, extend_prefix_lens=prefix, track_state=None, track_chunk_idx=None,
    )

"""What the feature rooms install into the core: one typed object, :data:`STRATEGIES`.

The core (``radix/`` top level, ``radix/ring/``) imports no feature room. Where a room changes a core
behaviour it installs a strategy here, through the core's installer named beside each field, from its
``install()`` (``radix/<room>/hooks.py``, run by ``radix.hooks.install_rooms``) or, for the read copy's
checkpoint copies, when it attaches to a pool. Each field's default is the core's behaviour without
the room; installing is idempotent (an entry per name, or the field replaced). This module imports
nothing of the package, so every layer may read it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

__all__ = ["STRATEGIES", "CheckpointCopies", "Disaggregation", "Strategies"]

#: The pd room's admission of a disaggregation mode: ``(mode, error, guard module name)`` -> a context in
#: which SGLang's own admission runs.
Disaggregation = Callable[[str, Callable[[str], BaseException], str], AbstractContextManager[None]]


class CheckpointCopies(Protocol):
    """A feature's copy of each checkpoint (the read copy): what the ring's folds and decode need of it.

    ``copy_of`` the pool's copy (or None); ``exact_fold`` whether folds replay the raw records (else
    they fold the copy's deltas ``copy.d``); ``mark_stale`` the copies of rewritten slots;
    ``replay_into`` the exact fold; ``gathered`` the copy's records of ``idx`` only (a private copy to
    replay into); ``layer_of`` the copy of one pool layer's ``ssm_states``, reached through the decode
    kernel SGLang called (or None); ``decode_step`` one decode step through the copy.
    """

    def copy_of(self, mamba_pool: Any) -> Any: ...

    def exact_fold(self) -> bool: ...

    def mark_stale(self, rc: Any, slots: Any) -> None: ...

    def replay_into(self, rc: Any, temporal: torch.Tensor, k: torch.Tensor, g: torch.Tensor, src: torch.Tensor,
                    dst: torch.Tensor, counts: torch.Tensor, *, is_kda: bool, layers: slice | None = None) -> None: ...

    def gathered(self, rc: Any, idx: torch.Tensor) -> Any: ...

    def layer_of(self, kernel: Any, ssm_states: torch.Tensor) -> Any: ...

    def decode_step(self, decode: Callable[..., Any], layer: Any, *args: Any) -> None: ...


def _no_rebuild(req: Any) -> tuple[int, int]:
    return 0, 0


def _no_record_pool(req_to_token_pool: Any) -> Any:
    return None


@dataclass
class Strategies:
    """The strategies installed into the core (module docstring); installer in brackets."""

    #: Admission checks run first: name -> ``check(server_args)`` raising ``ReplaySSMArgsError``
    #: (``radix.admission.add_check``; read copy).
    checks: dict[str, Callable[[Any], None]] = field(default_factory=dict)
    #: The admission of ``--disaggregation-mode`` (``radix.admission.use_disaggregation``; pd), None: refused.
    disaggregation: Disaggregation | None = None
    #: Per-slot charges beside the decode ring: name -> ``f(configurator, cache_params, record_len) -> bytes``
    #: (``radix.budget.add_slot_charge``; read copy).
    slot_charges: dict[str, Callable[[Any, Any, int], int]] = field(default_factory=dict)
    #: Reservations out of the KV budget: name -> ``f(configurator, rest_gib, *, spec_ring) -> GiB``
    #: (``radix.budget.add_reservation``; records).
    reservations: dict[str, Callable[..., float]] = field(default_factory=dict)
    #: ``req -> (rebuilt tokens, folded records)`` of its admitted hit (``radix.metrics.use_records``; records).
    rebuild_of: Callable[[Any], tuple[int, int]] = _no_rebuild
    #: The record pool of a ``req_to_token_pool`` (``radix.metrics.use_records``; records).
    record_pool_of: Callable[[Any], Any] = _no_record_pool
    #: The checkpoint copies the ring's folds and decode consult (``radix.ring.pool.use_checkpoint_copies``;
    #: read copy, when it attaches to a pool).
    checkpoint_copies: CheckpointCopies | None = None
    #: The extra_buffer end-state donation ``f(component, req, token_ids_len, is_finished)``
    #: (``radix.ring.donation.use_end_state``; records).
    end_state: Callable[[Any, Any, int, bool], None] | None = None


#: The process's strategies (one per process, like the hooks they serve).
STRATEGIES = Strategies()

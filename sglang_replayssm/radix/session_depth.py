"""A finished streaming-session turn keeps its record at the depth its state really reached.

SGLang 0.5.23's ``StreamingSession.try_cache_finished_req`` (session/streaming_session.py:156) keeps
a finished turn's KV record for the next turn and sets its committed length to
``len(origin_input_ids) + finished_len`` (clamped to the allocation), the full prompt + output.
Without overlap scheduling the request's own ``kv.kv_committed_len`` before the call is the depth
``D`` every layer's KV and the mamba state reached (decode and verify commit the tokens they
computed; the last sampled token is never computed). Two cases differ from SGLang's length ``C``:

* ``D < C`` (a speculative turn that ends on a verify's bonus token, i.e. the exact number of
  tokens): position ``D`` holds a rejected draft's KV or nothing, yet the next turn would take it
  as cached and extend from a state that never saw the last output token. The record keeps
  ``kv_committed_len = D``: the next turn prefills that token (as after a plain decode turn).
* ``D > C`` with a mamba state (a verify committed past ``max_new_tokens`` or a stop; SGLang trims
  only the KV, ``_trim_overshoot``): the state cannot be rewound, so the session's slot is released
  (``release_session``, SGLang's own path) and the next turn runs as a new request from the radix
  tree (which holds only states at their true depth).

Under overlap scheduling the host's committed length lags the device by an in-flight verify, so
``D`` is not the state's depth; there the turn is left to SGLang unchanged (speculative decoding on
the CPU runtime never overlaps). Switch: ``session_state_depth``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["finish_at_state_depth", "overlap_scheduled"]


def overlap_scheduled() -> bool:
    """Whether this scheduler overlaps forwards (SGLang's resolved ``disable_overlap_schedule``)."""
    from sglang.srt.runtime_context import get_schedule

    return not bool(get_schedule().disable_overlap_schedule)


def _finished_turn(session: Any, req: Any) -> bool:
    """A streaming turn on its slot that finished (not aborted, not retracted)."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    return (session.borrowed_slot(req) is not None and req.finished()
            and not isinstance(req.finished_reason, FINISH_ABORT))


def _has_mamba(session: Any) -> bool:
    return getattr(session.cache.req_to_token_pool, "mamba_allocator", None) is not None


def finish_at_state_depth(original: Callable[..., bool], session: Any, req: Any,
                          overlap: Callable[[], bool] = overlap_scheduled) -> bool:
    """AROUND body of ``StreamingSession.try_cache_finished_req``: SGLang's call, then the kept
    record's committed length set to the state's depth, or the slot released when the state ran
    past the kept tokens. Returns what SGLang returned (whether the session kept the record)."""
    if not _finished_turn(session, req) or overlap():
        return original(session, req)
    depth = int(req.kv.kv_committed_len)
    session_id = req.session.session_id
    kept = original(session, req)
    slot = session.slots.get(session_id) if kept else None
    if slot is None:
        return kept
    claimed = int(slot.kv.kv_committed_len)
    if claimed > depth:
        slot.kv.kv_committed_len = depth
    elif claimed < depth and _has_mamba(session):
        session.release_session(session_id)
    return kept

"""PD decode server: its own prefix hits, in one log line per admitted request (fix ``pd_hits``).

With ``--disaggregation-decode-enable-radix-cache`` a decode server matches each request against its
own radix tree before it asks the prefill server for the rest (``DecodePreallocQueue``,
disaggregation/decode.py:1502-1512, ``_match_prefix_and_lock`` at :860): the device-resident match
(``l1_prefix_len``) is written into the request's row and only the tokens past the whole match
(``decode_prefix_len``, with L2/L3 hits) are transferred. SGLang reports none of it: the decode
server runs no prefill batch (no "Prefill batch" line, ``sglang:cache_hit_rate`` stays 0) and the
``cached_tokens`` it returns, like its ``sglang:cached_tokens_total``, is the prefill server's.

Here, after ``_pre_alloc`` (disaggregation/decode.py:2237, the one call per admission that commits the
match: a request that did not fit is unlocked and matched again later, so the match itself would
count twice) the adapter logs::

    PD decode admission: #prompt-token: P, #decode-hit-token: H, #decode-host-hit-token: G,
    #mamba-lost-hit-token: L, decode hit rate: sum(H)/sum(P) = x%

``H`` = the device prefix reused from the decode tree, ``G`` = the L2/L3 part of the promised prefix
(HiCache on the decode side), ``L`` = KV-matched tokens dropped for lack of a mamba state at that
depth (fix ``lost_hit_metric``'s per-request value; 0 with it off). A retracted request that resumes
(``_pre_alloc(req)`` with no prefix) counts again with H = 0, as SGLang recomputes nothing for it but
re-receives nothing either. Totals are per process (one decode scheduler per process).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)
__all__ = ["LOG_PREFIX", "DecodeHits", "count_admission", "totals"]

LOG_PREFIX = "PD decode admission"

@dataclass
class DecodeHits:
    """Running totals of one decode process: admissions, prompt tokens, device hits, host hits, lost hits."""

    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    host_hit_tokens: int = 0
    lost_hit_tokens: int = 0

    @property
    def rate(self) -> float:
        """Device-hit tokens over prompt tokens (0.0 before the first admission)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


_lock = threading.Lock()
_totals = DecodeHits()


def totals() -> DecodeHits:
    """A copy of this process's totals."""
    with _lock:
        return DecodeHits(**vars(_totals))


def count_admission(result: Any, queue: Any, req: Any, prefix_indices: Any = None, prefix_len: int | None = None,
                    total_prefix_len: int | None = None) -> None:
    """After ``DecodePreallocQueue._pre_alloc``: add the request's hit to the totals and log the line."""
    from sglang_replayssm.radix.metrics import pop_lost_hit

    prompt = len(req.origin_input_ids)
    hit = int(prefix_len or 0)
    host = max(0, int(total_prefix_len or 0) - hit)
    lost = pop_lost_hit(req)
    with _lock:
        _totals.requests += 1
        _totals.prompt_tokens += prompt
        _totals.hit_tokens += hit
        _totals.host_hit_tokens += host
        _totals.lost_hit_tokens += lost
        done = DecodeHits(**vars(_totals))
    logger.info("%s: #prompt-token: %d, #decode-hit-token: %d, #decode-host-hit-token: %d, "
                "#mamba-lost-hit-token: %d, decode hit rate: %d/%d = %.1f%%", LOG_PREFIX, prompt, hit, host, lost,
                done.hit_tokens, done.prompt_tokens, 100.0 * done.rate)

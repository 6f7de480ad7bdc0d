"""The branch point SGLang tracks, placed on the chunk grid of the request's own prefix.

When an admission match finds KV deeper than its deepest mamba state, SGLang names a branch point
(``MambaComponent.finalize_match_result_in_tree_core``: ``mamba_branching_seqlen``, the deepest
multiple of the checkpoint grid inside the KV hit) and the request's prefill tracks the state there,
so the next request that leaves the path at that point hits it. An extend from ``prefix_len`` can
only hand out the states ``prefix_len + k * chunk`` (the chunk states ``h``), so the prefill tracks
the branch only when ``branch - prefix_len`` is a multiple of the chunk
(``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend``).

SGLang's own states lie on the grid, so its branch always qualifies. ReplaySSM's do not: an end
state at a request's full depth, a state planted from records, a streaming turn's state all sit at
exact depths (a 200-token system prompt's state at 200). A match resuming from such a state names a
branch SGLang then never tracks, and the shared point (a document's end) stays without a state for
every later request: each one resumes from the off-grid state and recomputes the shared tokens.

Fix ``branch_on_prefix_grid``: where the match's resume depth ``b`` (``device_prefix_len +
host_hit_length``, what the request's ``prefix_len`` becomes) is off the grid, the branch point is
``b + floor((kv_hit - b) / grid) * grid`` when that is deeper than ``b`` (the deepest depth inside the
KV hit the prefill can hand out), else none. On the grid both formulas agree. The tracked state is
the prefill's own exact chunk state; ``end_state_branch`` keeps it at the finish.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["branch_on_prefix_grid", "prefix_grid_branch"]


def prefix_grid_branch(resume: int, kv_hit: int, grid: int) -> int | None:
    """The deepest ``resume + k * grid`` (``k >= 1``) not past ``kv_hit``; None if ``kv_hit - resume < grid``."""
    if grid <= 0 or kv_hit - resume < grid:
        return None
    return resume + ((kv_hit - resume) // grid) * grid


def branch_on_prefix_grid(original: Callable[..., Any], component: Any, params: Any, result: Any) -> Any:
    """Re-place SGLang's branch point on the resume depth's grid where that depth is off the grid, then
    run SGLang's finalizer (the copy-on-write source) with the result."""
    grid = int(getattr(component, "mamba_checkpoint_grid", 0) or 0)
    resume = int(result.device_prefix_len) + int(result.host_hit_length or 0)
    if grid > 0 and resume % grid and params.req is not None:
        branch = prefix_grid_branch(resume, int(result.full_kv_hit_length or 0), grid)
        result = result._replace(mamba_branching_seqlen=branch)
    return original(component, params, result)

"""Fix ``reused_states_last`` (radix/eviction/order.py) on SGLang's real tree and LRU list.

Checked:

* the order: :func:`reorder` moves the most recently used states that two later requests went through to
  the MRU end, in their order, at most ``cap`` of them, and nothing else;
* the behaviour on ``UnifiedRadixCache`` (``tests/support/simulate.py``): a document's branch state that
  later requests resumed from outlives a run of fresh end states with the fix, and is evicted first without it;
* the gate: with ReplaySSM off (no decode ring) neither the order nor the TreeCore changes;
* the TreeCore choice: Python for a cache with mamba states and the decode ring, SGLang's otherwise.

Exactness: random streams (the records policy suite's ops, small state pools so nearly every admission evicts) with
the fix on and off, checked after every step against the fp64 oracle; 2 configurations x 2 x 4 examples x 50 steps
= 800 steps by default, ``SGLANG_REPLAYSSM_SLOW=1`` 10,000. The property suites (``tests/test_radix_property.py``,
``tests/test_records_policy.py``) run with every default fix, this one included.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_replayssm.radix import config
from sglang_replayssm.radix.eviction import order as state_eviction
from tests.support.policy_streams import EXAMPLES, STEPS, run_policy_streams
from tests.support.simulate import Sim, SimConfig


@pytest.fixture(scope="module", autouse=True)
def _adapter_installed(radix_adapter):
    return radix_adapter


def _lru(hits: list[int], referenced=None):
    """SGLang's mamba LRU list holding one node per entry of ``hits`` (its hit_count), the first the oldest;
    ``referenced``: SGLang's session partition predicate (None: no partition)."""
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedLRUList, UnifiedTreeNode

    components = (ComponentType.FULL, ComponentType.MAMBA)
    lru = UnifiedLRUList(ComponentType.MAMBA, components, is_referenced=referenced)
    nodes = []
    for count in hits:
        node = UnifiedTreeNode(components)
        node.hit_count = count
        lru.insert_mru(node)
        nodes.append(node)
    return lru, nodes


def _order(lru) -> list:
    """The list's nodes from its LRU end (evicted first) to its MRU end (sentinels left out)."""
    out, node = [], lru.tail.lru_prev[lru.component_type]
    while node is not lru.head:
        if node.id in lru.cache:
            out.append(node)
        node = node.lru_prev[lru.component_type]
    return out


def test_reorder_moves_the_most_recent_protected_states_last_in_their_order():
    lru, n = _lru([2, 0, 3, 1, 2, 0])  # n[0] oldest
    assert state_eviction.reorder(lru, cap=10) == 3
    assert _order(lru) == [n[1], n[3], n[5], n[0], n[2], n[4]]


def test_reorder_protects_at_most_cap_states_the_most_recent():
    lru, n = _lru([2, 0, 3, 1, 2, 0])
    assert state_eviction.reorder(lru, cap=2) == 2
    assert _order(lru) == [n[0], n[1], n[3], n[5], n[2], n[4]]  # n[0]: protected, but the oldest: it stays


def test_a_second_reorder_moves_only_newly_protected_states():
    lru, n = _lru([2, 0, 3, 1, 2, 0])
    state_eviction.reorder(lru, cap=10)
    assert state_eviction.reorder(lru, cap=10) == 0  # in place: nothing moves
    n[1].hit_count = 2
    lru.reset_node_mru(n[3])  # a hit on an unprotected state: now the most recent
    assert state_eviction.reorder(lru, cap=10) == 4
    assert _order(lru) == [n[5], n[3], n[1], n[0], n[2], n[4]]


def test_a_session_partitioned_list_keeps_its_halves():
    """With SGLang's session radix cache the list holds referenced nodes above the ``mid`` sentinel; protected
    states move within their half."""
    referenced = set()
    lru, n = _lru([2, 0, 3, 1, 2, 0], referenced=lambda node: node.id in referenced)
    referenced.add(n[1].id)
    lru.reset_node_mru(n[1])  # n[1] now in the referenced half
    assert state_eviction.reorder(lru, cap=10) == 3
    slot, node, above_mid = lru.component_type, lru.head.lru_next[lru.component_type], []
    while node is not lru.mid:
        above_mid.append(node)
        node = node.lru_next[slot]
    assert above_mid == [n[1]]
    assert _order(lru) == [n[3], n[5], n[0], n[2], n[4], n[1]]


def _document_then_fresh_states(fix_on: bool, ring: bool = True) -> tuple[int, int]:
    """A document (8 tokens) two later prompts left at its end, then a run of unrelated prompts, each
    leaving a fresh end state, more than the pool holds; returns the device hit depth of a prompt leaving the
    document at its end and the depth the third prompt resumed from."""
    cfg = SimConfig(kind="gdn", strategy="extra_buffer", track_interval=2, chunk=2, mamba_slots=10, vocab=64)
    doc = [1, 2, 3, 4, 5, 6, 7, 8]
    with config.override(True, reused_states_last=fix_on):
        sim = Sim(cfg)
        if not ring:
            sim.mamba_pool.enable_linear_replayssm = False  # the gate reads the pool's ReplaySSM flag
        sim.admit(doc + [9, 9], [0])  # the document's first visit: an end state at 10
        sim.admit(doc + [10, 10], [0])  # KV to 8, no state there: SGLang tracks the branch at 8
        third = sim.admit(doc + [11, 11], [0])  # resumes at 8; the document's node is now protected
        for i in range(12):  # fresh end states, none shared
            sim.admit([20 + i, 40 + i, 20 + i, 40 + i], [0])
        hit = sim.match(doc + [12, 12])
        if ring:
            sim.check()
    return int(hit.device_prefix_len), int(third.matched)


def test_a_reused_branch_state_outlives_fresh_end_states_only_with_the_fix():
    kept, resumed = _document_then_fresh_states(True)
    evicted, _ = _document_then_fresh_states(False)
    assert resumed == 8  # the branch state existed and was used
    assert kept == 8
    assert evicted < 8


def test_without_the_decode_ring_the_order_is_sglangs():
    assert _document_then_fresh_states(True, ring=False)[0] == _document_then_fresh_states(False, ring=False)[0] < 8


def _params(mamba: bool, ring: bool):
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    components = (ComponentType.FULL, ComponentType.MAMBA) if mamba else (ComponentType.FULL,)
    pool = SimpleNamespace(enable_linear_replayssm=ring, replayssm_write_pos=object(),
                           mamba_cache=SimpleNamespace(replayssm_d=0, replayssm_k=0, replayssm_g=0))
    return SimpleNamespace(tree_components=components, req_to_token_pool=SimpleNamespace(mamba_pool=pool))


@pytest.mark.parametrize(("mamba", "ring", "chosen", "expected"), [
    (True, True, "rust", "python"),
    (True, False, "rust", "rust"),  # ReplaySSM off: SGLang's choice
    (False, True, "rust", "rust"),  # no mamba states to order
    (True, True, "python", "python"),
])
def test_the_python_tree_core_only_where_states_are_ordered(mamba, ring, chosen, expected):
    params = _params(mamba, ring)
    assert state_eviction.python_tree_core(lambda name, p: chosen, "rust", params) == expected


@pytest.mark.parametrize(("reused", "stateless", "expected"), [
    (True, True, "python"), (True, False, "python"),
    (False, True, "python"),  # the Rust TreeCore's native walk would bypass stateless_kv_first's
    (False, False, "rust"),  # both off: SGLang's choice
])
def test_the_tree_core_hook_is_python_while_an_eviction_fix_is_on(reused, stateless, expected):
    from sglang_replayssm.radix.hooks import HOOKS, hook_fn

    hook = hook_fn("python_tree_core")
    params = _params(True, True)
    with config.override(True, reused_states_last=reused, stateless_kv_first=stateless):
        assert hook(lambda name, p: "rust", "rust", params) == expected
    # registered whichever fixes a server starts with (its body reads both)
    (record,) = [h for h in HOOKS if h.name == "python_tree_core"]
    assert record.fix is None


# ---- exactness under the new order: random streams, fix on and off -----------------------------------------

#: Small state pools, so nearly every admission evicts (records on and off).
STREAM_CONFIGS = [
    SimConfig(kind="gdn", strategy="extra_buffer", track_interval=2, chunk=2, mamba_slots=20),
    SimConfig(kind="gdn", strategy="extra_buffer", track_interval=2, chunk=2, mamba_slots=20, records=True,
              record_tokens=24, state_interval=4),
]
_counts = {"steps": 0, "moved": 0}


@pytest.fixture
def count_moves(monkeypatch):
    real = state_eviction.reorder

    def counting(lru, cap):
        moved = real(lru, cap)
        _counts["moved"] += moved
        return moved

    monkeypatch.setattr(state_eviction, "reorder", counting)


@pytest.mark.parametrize("fix_on", [True, False])
@pytest.mark.parametrize("cfg", STREAM_CONFIGS, ids=["records-off", "records24-states4"])
def test_streams_stay_exact_under_the_order(cfg, fix_on, count_moves):
    """After every step every radix node's state is its token path's (fp64 oracle) and every running request's
    checkpoint + ring reproduces its state (``Sim.check``): tokens are those of ReplaySSM off."""
    _counts["steps"] += run_policy_streams(cfg, reused_states_last=fix_on)


def test_the_streams_ran_and_reordered():
    """After the parametrised cases (file order): the order changed in the fix-on streams."""
    assert _counts["steps"] >= len(STREAM_CONFIGS) * 2 * EXAMPLES * STEPS
    assert _counts["moved"] >= 1, _counts

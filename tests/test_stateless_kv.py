"""Fix ``stateless_kv_first`` (radix/eviction/stateless_kv.py) on SGLang's real tree.

Checked:

* the classification: a node is dead when it holds no mamba state (device or host) and no record covers its
  first KV token; one lookup classifies many;
* the key: dead leaves sort before every live one, each group in SGLang's own order;
* the behaviour on ``UnifiedRadixCache`` (``tests/support/simulate.py``): a document whose state was evicted
  while it had children, left as a leaf once they went, is evicted before an older leaf with a state; without
  the fix SGLang's LRU takes the older live leaf (its hit is lost) and keeps the dead KV;
* the gate: with ReplaySSM off (no decode ring) the order is SGLang's.

Exactness: random streams with tiny KV pools (so nearly every admission evicts KV), fix on and off, checked
after every step against the fp64 oracle (``Sim.check``); the property suites run with every default fix.
"""

from __future__ import annotations

import pytest
import torch

from sglang_replayssm.radix import config
from sglang_replayssm.radix.eviction import stateless_kv
from tests.support.policy_streams import EXAMPLES, STEPS, run_policy_streams
from tests.support.simulate import Sim, SimConfig


@pytest.fixture(scope="module", autouse=True)
def _adapter_installed(radix_adapter):
    return radix_adapter


def _node(kv: list[int], state: bool = False, host_state: bool = False, device: str = "cpu"):
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeNode

    node = UnifiedTreeNode((ComponentType.FULL, ComponentType.MAMBA))
    node.component_data[ComponentType.FULL].value = torch.tensor(kv, dtype=torch.int64, device=device)
    if state:
        node.component_data[ComponentType.MAMBA].value = torch.tensor([0])
    if host_state:
        node.component_data[ComponentType.MAMBA].host_value = torch.tensor([0])
    return node


def _dead(nodes, slot_of=None):
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    return stateless_kv.dead_leaves(nodes, ComponentType.FULL, ComponentType.MAMBA, slot_of)


def test_a_node_without_state_or_records_is_dead():
    live, host, bare = _node([1, 2], state=True), _node([3], host_state=True), _node([4, 5])
    assert _dead([live, host, bare]) == {bare}


def test_a_session_referenced_node_keeps_sglangs_order():
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    session, bare = _node([1, 2]), _node([4, 5])
    session.component_data[ComponentType.FULL].session_ref = 1
    assert _dead([session, bare]) == {bare}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA"))])
def test_a_record_at_the_first_token_keeps_a_stateless_node(device):
    slot_of = torch.full((16,), -1, dtype=torch.int64, device=device)
    slot_of[[4, 9]] = torch.tensor([0, 1], device=device)
    covered, tail_only, bare = _node([4, 5], device=device), _node([8, 9], device=device), _node([10], device=device)
    assert _dead([covered, tail_only, bare], slot_of) == {tail_only, bare}


def test_the_key_puts_dead_leaves_first_each_group_in_sglangs_order():
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    nodes = [_node([1], state=True), _node([2]), _node([3], state=True), _node([4])]
    age = {n: i for i, n in enumerate(nodes)}  # SGLang's key: the lower, the sooner evicted
    key = stateless_kv.DeadFirst(age.__getitem__, ComponentType.FULL, ComponentType.MAMBA)
    key.classify(nodes[:3], None)
    assert sorted(nodes, key=key) == [nodes[1], nodes[3], nodes[0], nodes[2]]  # nodes[3]: classified on its own


CFG = SimConfig(kind="gdn", strategy="extra_buffer", track_interval=2, chunk=2, mamba_slots=16, vocab=64)
DOC = [1, 2, 3, 4, 5, 6, 7, 8]
OLD = [20, 21, 22, 23, 24, 25, 26, 27, 28, 29]


def _document_left_stateless(fix_on: bool, ring: bool = True) -> tuple[int, int, bool]:
    """An old prompt's leaf (state at 10), then a document two prompts went through (a state at 8, a child
    with a state); the document's state and then its child go (SGLang's state walk, in an order set on its
    LRU list), the old leaf's state stays, so the document is a stateless leaf whose KV is newer than the old
    live leaf's. Then one token of KV is evicted. Returns the old prompt's hit depth, the document's matched KV
    depth, and whether the document was the one stateless leaf before."""
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    with config.override(True, stateless_kv_first=fix_on, reused_states_last=False):
        sim = Sim(CFG)
        if not ring:
            sim.mamba_pool.enable_linear_replayssm = False
        sim.admit(OLD, [0])
        sim.admit(DOC + [9, 9], [0])
        sim.admit(DOC + [10, 10], [0])
        tree = sim.cache.tree_core
        old, doc = (next(c for c in tree.root_node.children.values() if c.key.token_ids[0] == prompt[0])
                    for prompt in (OLD, DOC))
        states = tree.lru_lists[ComponentType.MAMBA]
        for node in (*doc.children.values(), old):  # the document's state is now the oldest, the old prompt's
            states.reset_node_mru(node)              # the newest; the KV ages stay
        sim.evict(mamba_num=2)  # the document's state (a tombstone: it has a child), then its child (a leaf)
        stateless = [leaf for leaf in tree.evictable_device_leaves
                     if leaf.component_data[ComponentType.MAMBA].value is None]
        was_dead = len(stateless) == 1 and sim.match(DOC).full_kv_hit_length == len(DOC)
        sim.evict(num_tokens=1)
        hit = sim.match(OLD)
        if ring:
            sim.check()
    return int(hit.device_prefix_len), int(sim.match(DOC).full_kv_hit_length), was_dead


def test_a_stateless_leaf_goes_before_an_older_leaf_with_a_state_only_with_the_fix():
    kept, doc_kv, was_dead = _document_left_stateless(True)
    assert was_dead
    assert kept == len(OLD)
    assert doc_kv == 0
    lost, doc_kv, _ = _document_left_stateless(False)
    assert lost == 0
    assert doc_kv == len(DOC)  # SGLang kept the KV no match can resume from


def test_without_the_decode_ring_the_order_is_sglangs():
    assert _document_left_stateless(True, ring=False)[:2] == _document_left_stateless(False, ring=False)[:2]


# ---- exactness under the new order: random streams with tiny KV pools, fix on and off ------------------------

STREAM_CONFIGS = [
    SimConfig(kind="gdn", strategy="extra_buffer", track_interval=2, chunk=2, mamba_slots=24, kv_size=96),
    SimConfig(kind="gdn", strategy="extra_buffer", track_interval=2, chunk=2, mamba_slots=24, kv_size=96,
              records=True, record_tokens=24, state_interval=4),
]
_counts = {"steps": 0, "dead": 0}


@pytest.fixture
def count_dead(monkeypatch):
    real = stateless_kv.dead_leaves

    def counting(*args, **kwargs):
        dead = real(*args, **kwargs)
        _counts["dead"] += len(dead)
        return dead

    monkeypatch.setattr(stateless_kv, "dead_leaves", counting)


@pytest.mark.parametrize("fix_on", [True, False])
@pytest.mark.parametrize("cfg", STREAM_CONFIGS, ids=["records-off", "records24-states4"])
def test_streams_stay_exact_under_the_order(cfg, fix_on, count_dead):
    """After every step every radix node's state is its token path's (fp64 oracle) and every running request's
    checkpoint + ring reproduces its state (``Sim.check``): tokens are those of ReplaySSM off."""
    _counts["steps"] += run_policy_streams(cfg, stateless_kv_first=fix_on)


def test_the_streams_ran_and_found_dead_leaves():
    """After the parametrised cases (file order): the fix-on streams evicted KV with dead leaves among them."""
    assert _counts["steps"] >= len(STREAM_CONFIGS) * 2 * EXAMPLES * STEPS
    assert _counts["dead"] >= 1, _counts

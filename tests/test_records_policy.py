"""The record policy's switches on SGLang's real radix cache (``tests/support/simulate.py``).

``end_state_branch`` (radix/records/donation.py): an extra_buffer finish with records keeps the state
SGLang tracked at the request's branch point (the match found KV past every state and no records to
plant one) instead of swapping in the end state; ``branch_on_prefix_grid`` (radix/records/branch_grid.py):
a match resuming from a state off the chunk grid gets its branch point on its own prefix's grid, so its
prefill tracks it; ``record_refresh`` (radix/records/match.py): a hit rebuilt from an interval state moves
only the records it folds to the young end of the pool. Checked:

* the behaviour: with each fix a later prompt leaving at the branch point hits there; without
  ``end_state_branch`` the end state replaced that state, without ``branch_on_prefix_grid`` none was
  tracked, and the hit falls back;
* exactness: random request streams (admit / decode / finish / abort / evict / match / copy, the
  property suite's ops, and requests that finish at prefill) with the fix on and off, small first-in-first-out record pools so plants fail
  and branch points are tracked; after every step every radix node's state is its token path's (fp64
  oracle) and every running request's checkpoint + ring reproduces its state, so the tokens are those
  of ReplaySSM off. 3 configurations x 2 switch states x 4 examples x 50 steps = 1,200 steps by default
  (a few seconds); ``SGLANG_REPLAYSSM_SLOW=1`` runs 3 x 2 x 50 x 50 = 15,000.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from sglang_replayssm.radix import config
from sglang_replayssm.radix.records import branch_grid, donation, match
from sglang_replayssm.radix.records.pool import pool_of
from tests.support.simulate import Sim, SimConfig
from tests.test_radix_property import MAX_RUNNING, _apply, _op, _run, ops, prompts, tokens

SLOW = os.environ.get("SGLANG_REPLAYSSM_SLOW") == "1"
EXAMPLES = 50 if SLOW else 4
STEPS = 50
#: The property suite's ops plus ``admit1``: a request that finishes at prefill (no decode track moves
#: its tracked depth past the branch point, so its finish is where the switch decides).
policy_ops = st.one_of(ops, st.tuples(prompts, tokens).map(lambda args: _op("admit1", args)))
CONFIGS = [
    SimConfig(kind="gdn", strategy="extra_buffer", track_interval=2, chunk=2, records=True, record_tokens=12),
    SimConfig(kind="gdn", strategy="extra_buffer", track_interval=2, chunk=2, records=True, record_tokens=24,
              state_interval=4),
    SimConfig(kind="gdn", strategy="extra_buffer", track_interval=4, chunk=4, records=True, record_tokens=8,
              state_interval=4),
]
_counts = {"steps": 0, "kept": 0, "refreshed": 0, "regridded": 0}
#: The switch sets under test: the default (both on) and the earlier policy (both off).
POLICIES = {"branch-refresh": {"end_state_branch": True, "record_refresh": True, "branch_on_prefix_grid": True},
            "end-state-all": {"end_state_branch": False, "record_refresh": False, "branch_on_prefix_grid": False}}


@pytest.fixture(scope="module", autouse=True)
def _adapter_installed(radix_adapter):
    return radix_adapter


def _apply_policy(sim: Sim, op: tuple) -> None:
    if op[0] != "admit1":
        _apply(sim, op)
    elif len(sim.running) < MAX_RUNNING:
        sim.admit(op[1], [op[2]])
    else:
        sim.decode()


@pytest.fixture
def count_kept(monkeypatch):
    """Count the finishes where the branch state was kept, the refreshes and the branch points placed on an
    off-grid prefix's grid (the paths under test ran)."""
    real, real_refresh, real_branch = donation.keeps_branch_state, match.refresh, branch_grid.prefix_grid_branch

    def counting(req):
        kept = real(req)
        _counts["kept"] += kept
        return kept

    def counting_refresh(pool, kv):
        moved = real_refresh(pool, kv)
        _counts["refreshed"] += moved
        return moved

    def counting_branch(resume, kv_hit, grid):
        branch = real_branch(resume, kv_hit, grid)
        _counts["regridded"] += branch is not None
        return branch

    monkeypatch.setattr(donation, "keeps_branch_state", counting)
    monkeypatch.setattr(branch_grid, "prefix_grid_branch", counting_branch)
    monkeypatch.setattr(match, "refresh", counting_refresh)


def _branch_then_probe(fix_on: bool) -> tuple[int, int]:
    """A prompt whose records are gone by the time a second prompt leaves it at depth 8; returns the
    device hit depth of a third prompt leaving at 8 and the depth SGLang tracked for the second one."""
    cfg = SimConfig(kind="gdn", strategy="extra_buffer", track_interval=2, chunk=2, records=True, record_tokens=8,
                    vocab=10)
    stem = [1, 2, 3, 4, 5, 6, 7, 8]
    with config.override(True, end_state_branch=fix_on):
        sim = Sim(cfg)
        sim.admit(stem + [9, 9, 9, 9], [0])  # donates its end state at depth 12 (end_state)
        sim.admit([5, 5, 5, 5, 5, 5, 5, 5, 5, 5], [0])  # evicts the first prompt's records (8-token pool)
        second = sim.admit(stem + [0, 0, 0, 0], [0])  # KV to 8, no state there, no records: SGLang tracks 8
        tracked = int(second.matched)
        hit = sim.match(stem + [3, 3, 3, 3])
        sim.check()
    return int(hit.device_prefix_len), tracked


def test_a_branch_state_is_kept_only_with_the_fix():
    kept_depth, tracked = _branch_then_probe(True)
    swapped_depth, _ = _branch_then_probe(False)
    assert tracked == 0  # the second prompt missed (the case the fix is for)
    assert kept_depth == 8
    assert swapped_depth < 8


def test_refresh_moves_rows_to_the_young_end():
    """``refresh``: the tokens keep their rows, now in the slots the pool hands out next (the oldest), and
    those slots' former tokens lose their records, as for any new token."""
    cfg = SimConfig(kind="gdn", strategy="extra_buffer", track_interval=2, chunk=2, records=True, record_tokens=16)
    with config.override(True):
        sim = Sim(cfg)
        sim.admit([1, 2, 3, 4, 5, 6], [0])
        sim.admit([7, 7, 7, 7, 7, 7, 7, 7], [0])
        pool = pool_of(sim.req_pool)
        kv = torch.nonzero(pool.slot_of[:-1] >= 0).reshape(-1)[:4]  # four tokens with records
        old = pool.slots(kv).clone()
        rows = {lid: rec.x[old].clone() for lid, rec in pool.layers.items()}
        head = pool.head
        assert match.refresh(pool, kv)
        new = pool.slots(kv)
        assert new.tolist() == [(head + i) % pool.capacity for i in range(4)]
        for lid, rec in pool.layers.items():
            assert torch.equal(rec.x[new], rows[lid])
        with config.override(record_refresh=False):
            assert not match.refresh(pool, kv)


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("cfg", CONFIGS, ids=[f"records{c.record_tokens}-states{c.state_interval}" for c in CONFIGS])
def test_streams_stay_exact(cfg, policy, count_kept):
    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
              phases=(Phase.explicit, Phase.generate), suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(policy_ops, min_size=STEPS, max_size=STEPS))
    def streams(stream):
        with config.override(True, **POLICIES[policy]):
            _run(cfg, stream, apply=_apply_policy)
        _counts["steps"] += len(stream)

    streams()


def test_the_streams_ran_and_reached_the_branch_path():
    """After the parametrised cases (file order)."""
    assert _counts["steps"] >= len(CONFIGS) * 2 * EXAMPLES * STEPS
    assert _counts["kept"] >= 1 and _counts["refreshed"] >= 1 and _counts["regridded"] >= 1, _counts



def _off_grid_branch(fix_on: bool) -> tuple[int, int]:
    """A state off the chunk grid (a 5-token prompt's end state, grid 4), then a document behind it whose
    records are gone when a second prompt leaves it at depth 16; returns the depth that prompt resumed
    from and the device hit depth of a third prompt leaving at 16 (what the second one's prefill tracked)."""
    cfg = SimConfig(kind="gdn", strategy="extra_buffer", track_interval=4, chunk=4, records=True, record_tokens=8,
                    vocab=10)
    system, doc = [1, 2, 3, 4, 5], [6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8]
    with config.override(True, branch_on_prefix_grid=fix_on):
        sim = Sim(cfg)
        sim.admit(system, [0])  # finishes at prefill: its end state at depth 5 (end_state)
        sim.admit(system + doc + [9, 9, 9, 9, 9], [0])  # first visit of the document
        sim.admit([5, 5, 5, 5, 5, 5, 5, 5, 5, 5], [0])  # evicts the document's records (8-token pool)
        second = sim.admit(system + doc + [2, 2, 2, 2, 2, 2], [0])  # KV to 16, state at 5, no records
        hit = sim.match(system + doc + [4, 4, 4, 4, 4, 4])
        sim.check()
    return int(second.matched), int(hit.device_prefix_len)


def test_a_branch_behind_an_off_grid_state_is_tracked_only_with_the_fix():
    resumed, hit = _off_grid_branch(True)
    resumed_off, hit_off = _off_grid_branch(False)
    assert resumed == resumed_off == 5  # the second prompt resumed from the off-grid state
    assert hit == 13  # 5 + 2 x 4: the deepest depth of the second prefill's grid inside the KV hit (16)
    assert hit_off == 5  # SGLang's branch (16) is off that grid: never tracked, the state stays at 5


def _tail_refresh_probe() -> tuple[int, int]:
    """A path B, then a path A filling the 32-record pool; a branch of A at depth 14 is rebuilt from A's interval
    state at 12 (interval 4); then a probe leaves B at depth 12, where B has an interval state and its tail
    records if the branch's refresh left them. Returns (the branch's hit, the probe's hit)."""
    cfg = SimConfig(kind="gdn", strategy="extra_buffer", track_interval=2, chunk=2, records=True, record_tokens=32,
                    state_interval=4, vocab=10)
    b = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5]
    a = [5, 4, 3, 2, 1, 9, 8, 7, 6, 5, 4, 3, 2, 1, 9, 8]
    with config.override(True):
        sim = Sim(cfg)
        sim.admit(b, [0])  # records in slots 0-13
        sim.admit(a, [0])  # slots 14-29
        branch = sim.admit(a[:14] + [7, 7], [0])  # rebuilt from A's state at 12: its tail (records 9-13) moves
        probe = sim.admit(b[:12] + [6, 6, 6], [0])
        sim.check()
    return int(branch.matched), int(probe.matched)


def test_a_rebuild_from_an_interval_state_refreshes_only_the_records_it_folds():
    """``record_refresh`` moves the records the job reads (the tail after the interval state, its conv lead
    included), not the whole span: moving A's 14 records evicted B's oldest 12 (B's tail among them), and
    the probe leaving B at its interval state lost its hit."""
    branch, probe = _tail_refresh_probe()
    assert branch == 14
    assert probe == 12

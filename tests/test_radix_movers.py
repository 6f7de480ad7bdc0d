"""Issue 4 on SGLang 0.5.23's real pools and radix tree (CPU tensors, SGLang's own test kit): slots
whose decode ring holds pending records keep exactly their state when an extend forward reads them
(mixed chunks, streaming-session turns), when a retracted request is backed up to CPU and resumed,
and when a slot is freed with a stale cursor and handed to a new owner.

Each fix is run on and off (``extend_fold``, ``retract_backup``; off = SGLang's behaviour on that
path, every other adapter fix on); states are compared with the fp64 recurrence of the token path
(relative error <= 1e-5) and cursors are asserted. Ring length L=4, GDN (H=1, HV=2) and KDA (H=HV=2).
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sglang_replayssm.radix import config, hooks
from tests.support.simulate import Sim, SimConfig, rel_err

TOL = 1e-5
KINDS = pytest.mark.parametrize("kind", ["gdn", "kda"])


@pytest.fixture(scope="module", autouse=True)
def _adapter_installed(radix_adapter):
    assert {h.target for h in radix_adapter} >= {
        h.target for h in hooks.HOOKS if h.fix in ("extend_fold", "retract_backup", "cursor_reset")
    }


def _switches(fix: str, on: bool) -> dict:
    """Every adapter fix on, except ``fix`` when ``on`` is False."""
    return {} if on else {fix: False}


def _state_errors(sim: Sim, slot: int, path: list[int]) -> list[float]:
    got, want = sim.slot_state(slot), sim.model.oracle(path)
    return [rel_err(g, w) for g, w in zip(got, want)]


# ---- extend over a slot with pending records (mixed chunks, streaming sessions) -----------------


@KINDS
@pytest.mark.parametrize("fix_on", [True, False], ids=["extend_fold-on", "extend_fold-off"])
def test_mixed_batch_decode_rows_keep_their_pending_records(kind, fix_on):
    """``--enable-mixed-chunk``: a running request's decode step runs as a 1-token extend row of a
    MIXED batch. SGLang's extend reads ``temporal`` (the checkpoint, lagging by the pending records)
    and leaves the cursor, so the state regresses and the next decode folds the records again."""
    with config.override(True, **_switches("extend_fold", fix_on)):
        sim = Sim(SimConfig(kind=kind, strategy="no_buffer", track_interval=3))
        a = sim.admit([1, 2, 3, 4, 5], [6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3])
        b = sim.admit([5, 4, 3], [2, 1, 9, 8, 7, 6, 5, 4, 3, 2])
        wp_a = sim.decode_until_pending(a, min_steps=5)  # wrapped at least once (L=4)
        sim.decode([b])
        assert wp_a > 0 and int(sim.write_pos[int(b.req.kv.mamba_pool_idx)]) > 0
        sim.check()
        sim.extend_running([(a, []), (b, [])], "MIXED")
        problems = sim.live_problems(TOL)
        if fix_on:
            assert problems == []
            assert all(int(sim.write_pos[int(s.req.kv.mamba_pool_idx)]) == 0 for s in (a, b))
        else:
            assert any("state rel err" in p for p in problems), problems
            assert int(sim.write_pos[int(a.req.kv.mamba_pool_idx)]) == wp_a  # the stale records stay live
        if fix_on:  # decoding on from the folded slot stays exact, through flushes
            for _ in range(5):
                sim.decode()
                sim.check()


@KINDS
@pytest.mark.parametrize("strategy", ["no_buffer", "extra_buffer"])
@pytest.mark.parametrize("fix_on", [True, False], ids=["extend_fold-on", "extend_fold-off"])
def test_streaming_session_turn_extends_the_kept_slot_exactly(kind, strategy, fix_on):
    """``--enable-streaming-session``: the session keeps the finished turn's slot (ring included);
    the next turn extends it with the last output token plus its new prompt, then decodes."""
    with config.override(True, **_switches("extend_fold", fix_on)):
        sim = Sim(SimConfig(kind=kind, strategy=strategy, track_interval=3))
        turn = sim.admit([1, 2, 3, 4, 5, 6], [7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6])
        sim.decode_until_pending(turn, min_steps=6)
        sim.extend_running([(turn, [9, 8, 7, 6, 5])], "EXTEND")  # the next turn's prompt
        errs = _state_errors(sim, int(turn.req.kv.mamba_pool_idx), turn.consumed)
        if fix_on:
            assert max(errs) <= TOL and int(sim.write_pos[int(turn.req.kv.mamba_pool_idx)]) == 0
            for _ in range(6):
                sim.decode([turn])
                sim.check()
        else:
            assert max(errs) > 1e-3


@pytest.mark.parametrize("fix_on", [True, False], ids=["extend_fold-on", "extend_fold-off"])
def test_cleared_row_ends_zero_with_an_empty_ring(fix_on):
    """A row SGLang clears before the extend (``mamba_needs_clear``) must start from the zero state;
    ``clear_slots`` zeroes conv/temporal but not the cursor, so a slot carrying records would fold
    them onto zero at its next decode. With the fold first, the cleared slot's ring is empty."""
    with config.override(True, **_switches("extend_fold", fix_on)):
        sim = Sim(SimConfig(kind="gdn", strategy="no_buffer", track_interval=3))
        a = sim.admit([1, 2, 3, 4], [5, 6, 7, 8, 9, 1, 2, 3])
        sim.decode_until_pending(a, min_steps=2)
        slot = int(a.req.kv.mamba_pool_idx)
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.model_executor.model_runner import ModelRunner

        fb = SimpleNamespace(
            forward_mode=ForwardMode.EXTEND,
            req_pool_indices=torch.tensor([a.req.kv.req_pool_idx]),
            mamba_clear_indices=torch.tensor([slot]),
            mamba_cow_src_indices=None,
            mamba_cow_dst_indices=None,
        )
        ModelRunner._maybe_execute_deferred_mamba_cow_and_clear(
            SimpleNamespace(req_to_token_pool=sim.req_pool, is_draft_worker=False), fb
        )
        assert torch.count_nonzero(sim.temporal[:, slot]) == 0
        assert (int(sim.write_pos[slot]) == 0) == fix_on


@pytest.mark.parametrize(
    "mode, original, folds",
    [("MIXED", None, True), ("EXTEND", None, True), ("EXTEND", "DECODE", False), ("DECODE", None, False),
     ("TARGET_VERIFY", None, False)],
    ids=["mixed", "extend", "dp-relabelled-decode", "decode", "target-verify"],
)
def test_which_forwards_fold(mode, original, folds):
    """Extend and MIXED forwards fold; a decode batch (also one relabelled as a 1-token extend for
    DP collectives, whose mamba layers run decode) and spec verify are left to their kernels."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.model_runner import ModelRunner

    with config.override(True):
        sim = Sim(SimConfig(kind="gdn", strategy="no_buffer", track_interval=3))
        a = sim.admit([1, 2, 3, 4], [5, 6, 7, 8, 9, 1, 2, 3])
        wp = sim.decode_until_pending(a, min_steps=2)
        slot = int(a.req.kv.mamba_pool_idx)
        fb = SimpleNamespace(
            forward_mode=ForwardMode[mode],
            logical_forward_mode=ForwardMode[original or mode],
            req_pool_indices=torch.tensor([a.req.kv.req_pool_idx, 0]),  # row 0: padding (slot 0)
            mamba_clear_indices=None,
            mamba_cow_src_indices=None,
            mamba_cow_dst_indices=None,
        )
        pad_wp = int(sim.write_pos[0])
        ModelRunner._maybe_execute_deferred_mamba_cow_and_clear(
            SimpleNamespace(req_to_token_pool=sim.req_pool, is_draft_worker=False), fb
        )
        assert int(sim.write_pos[slot]) == (0 if folds else wp)
        assert int(sim.write_pos[0]) == pad_wp  # the padding slot is never folded
        sim.check()  # folding preserves the state either way


@pytest.mark.parametrize(
    "mode, streaming, folds",
    [("EXTEND", False, False), ("MIXED", False, True), ("EXTEND", True, True)],
    ids=["plain-extend-skips", "mixed-folds", "streaming-session-folds"],
)
@pytest.mark.parametrize("debug", [False, True], ids=["", "debug-memory-pool"])
def test_only_mixed_batches_and_streaming_sessions_fold(mode, streaming, folds, debug):
    """With the server's args known, only the two extends whose rows can hold records fold (a plain
    extend's rows are fresh or copied from exact states, so it skips the fold's launches). Under
    SGLang's debug memory pool a plain extend over a slot with records is refused in one line."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.model_runner import ModelRunner

    with config.override(True):
        sim = Sim(SimConfig(kind="gdn", strategy="no_buffer", track_interval=3))
        a = sim.admit([1, 2, 3, 4], [5, 6, 7, 8, 9, 1, 2, 3])
        wp = sim.decode_until_pending(a, min_steps=2)
        slot = int(a.req.kv.mamba_pool_idx)
        fb = SimpleNamespace(forward_mode=ForwardMode[mode], logical_forward_mode=None,
                             req_pool_indices=torch.tensor([a.req.kv.req_pool_idx]), mamba_clear_indices=None,
                             mamba_cow_src_indices=None, mamba_cow_dst_indices=None)
        runner = SimpleNamespace(req_to_token_pool=sim.req_pool, is_draft_worker=False,
                                 server_args=SimpleNamespace(enable_streaming_session=streaming))
        sim.mamba_pool.debug_memory_pool = debug
        try:
            if debug and not folds:
                with pytest.raises(AssertionError, match=f"slots \\[{slot}\\] with pending ring records"):
                    ModelRunner._maybe_execute_deferred_mamba_cow_and_clear(runner, fb)
            else:
                ModelRunner._maybe_execute_deferred_mamba_cow_and_clear(runner, fb)
        finally:
            sim.mamba_pool.debug_memory_pool = False
        assert int(sim.write_pos[slot]) == (0 if folds else wp)
        sim.check()  # folding preserves the state; skipping leaves the ring as it was


# ---- CPU retraction backup (Req.offload_kv_cache / load_kv_cache) ----------------------------------


ROUTES = pytest.mark.parametrize(
    "route",
    ["kv-pool-carries-mamba", "req-carries-mamba"],
    ids=["HybridLinearKVPool.get_cpu_copy", "Req.offload_kv_cache-mamba_cpu"],
)


@KINDS
@ROUTES
@pytest.mark.parametrize("reuse", [False, True], ids=["resume-into-its-slot", "slot-reused-meanwhile"])
@pytest.mark.parametrize("fix_on", [True, False], ids=["retract_backup-on", "retract_backup-off"])
def test_retracted_request_resumes_with_exactly_its_state(kind, route, reuse, fix_on):
    """Both CPU backup routes end in ``MambaPool.get_cpu_copy`` (conv + temporal only): the
    KV pool's own copy (``HybridLinearKVPool``, ``cpu_copy_carries_mamba``) or the request's
    ``mamba_cpu`` (KV pools that do not carry mamba). Without the fix the pending records are lost
    and the resumed state regresses; with it the copy is the full state and the new slot's ring is
    empty. Several retract/resume cycles with wrapped rings, then decoding on, all exact. With
    ``slot-reused-meanwhile`` another request takes and decodes into the freed slot before the
    resume (on a CPU pool SGLang's KV-pool route would hand back a view of that slot)."""
    with config.override(True, **_switches("retract_backup", fix_on)):
        sim = Sim(SimConfig(kind=kind, strategy="no_buffer", track_interval=3))
        if route == "req-carries-mamba":
            sim.allocator.get_kvcache().cpu_copy_carries_mamba = False
        a = sim.admit([1, 2, 3, 4, 5], [(3 * j + 2) % 10 for j in range(40)])
        other = sim.admit([9, 9, 8], [(7 * j + 1) % 10 for j in range(40)])
        for cycle in range(3):
            sim.decode_until_pending(a, min_steps=5 + cycle)
            sim.decode([other])  # keeps another ring live in the pool meanwhile
            path = a.consumed
            old_slot = int(a.req.kv.mamba_pool_idx)
            sim.retract(a, backup=True)
            sim.next_mamba_slots([old_slot])
            if reuse:
                c = sim.admit([7, 7, 3, cycle], [(5 * j + 4) % 10 for j in range(4)])
                assert int(c.req.kv.mamba_pool_idx) == old_slot
                sim.decode([c])
            slot = sim.resume(a)  # into the very slot it left (stale cursor), or another one
            assert a.consumed == path
            errs = _state_errors(sim, slot, path)
            if not fix_on:
                assert max(errs) > 1e-3
                return
            assert int(sim.write_pos[slot]) == 0
            assert max(errs) <= TOL, errs
            sim.check()
        for _ in range(6):
            sim.decode()
            sim.check()


@KINDS
def test_cpu_copy_leaves_the_live_slot_untouched(kind):
    """The backup folds the records into the copy, not into the live slot: checkpoint, ring and
    cursor are unchanged and the request decodes on exactly."""
    with config.override(True):
        sim = Sim(SimConfig(kind=kind, strategy="no_buffer", track_interval=3))
        a = sim.admit([1, 2, 3, 4, 5], [(3 * j + 2) % 10 for j in range(20)])
        wp = sim.decode_until_pending(a, min_steps=2)
        slot = int(a.req.kv.mamba_pool_idx)
        cache = sim.mamba_pool.mamba_cache
        tensors = (cache.temporal, cache.replayssm_d, cache.replayssm_k, cache.replayssm_g)
        before = [t[:, slot].clone() for t in tensors]
        for idx in (torch.tensor([slot]), torch.tensor(slot)):  # both index shapes SGLang passes
            conv_cpu, temporal_cpu = sim.mamba_pool.get_cpu_copy(idx)[:2]
            want = sim.model.oracle(a.consumed)
            t = temporal_cpu.reshape(sim.cfg.mamba_layers, -1, *temporal_cpu.shape[-3:])[:, 0]
            assert max(rel_err(t[li], want[li]) for li in range(len(want))) <= TOL
        assert all(torch.equal(t[:, slot], b) for t, b in zip(tensors, before))
        assert int(sim.write_pos[slot]) == wp
        sim.decode()
        sim.check()


# ---- aborts, frees, retract-to-queue: stale cursors are unobservable -----------------------------


def _sglang_root() -> Path:
    import sglang

    return Path(sglang.__file__).parent


def test_slots_leave_the_allocator_only_through_alloc():
    """The cursor choke point (an AFTER hook on ``MambaSlotAllocator.alloc``) covers every owner
    iff no slot leaves the free list another way. In SGLang 0.5.23: only ``_do_alloc`` takes slots
    off ``free_slots``; its callers are ``alloc`` and ``alloc_group_begin``, whose pre-allocated
    slots are handed out only by ``alloc`` (``next(self._alloc_iter)``) or freed back by
    ``alloc_group_end``; and no other module touches ``_do_alloc``, ``_alloc_iter`` or assigns
    ``free_slots`` of a mamba slot allocator (the MLX backend's look-alike and the unified pool,
    which the decode ring is not wired for, have their own classes)."""
    from sglang.srt.mem_cache.allocator.mamba import MambaSlotAllocator

    tree = ast.parse(inspect.getsource(MambaSlotAllocator))
    methods = {f.name: f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}

    def calls(fn: ast.FunctionDef, attr: str) -> bool:
        return any(isinstance(n, ast.Attribute) and n.attr == attr for n in ast.walk(fn))

    def assigns_free_slots(fn: ast.FunctionDef) -> bool:
        return any(
            isinstance(n, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "free_slots" for t in n.targets)
            for n in ast.walk(fn)
        )

    assert {name for name, fn in methods.items() if calls(fn, "_do_alloc") and name != "_do_alloc"} == {
        "alloc", "alloc_group_begin",
    }
    # free_slots shrinks only in _do_alloc (free/clear only grow or reset it).
    assert {name for name, fn in methods.items() if assigns_free_slots(fn)} == {"_do_alloc", "free", "clear"}
    readers = {name for name, fn in methods.items() if "next(self._alloc_iter" in ast.unparse(fn)}
    assert readers == {"alloc"}
    assert "self.free(" in ast.unparse(methods["alloc_group_end"])
    offenders = []
    for path in (_sglang_root() / "srt").rglob("*.py"):
        text = path.read_text(errors="replace")
        if re.search(r"mamba_allocator\.(_do_alloc|_alloc_iter)|mamba_allocator\.free_slots\s*=", text):
            offenders.append(str(path))
    assert offenders == []


def _stale_free_slot(sim: Sim, how: str) -> tuple[int, int]:
    """Free a running request's slot with pending records the way SGLang does for ``how``."""
    c = sim.admit([9, 8, 7], [(j * 5 + 3) % 10 for j in range(20)])
    slot = int(c.req.kv.mamba_pool_idx)
    wp = sim.decode_until_pending(c, min_steps=2)
    if how == "abort":
        sim.abort(c)
    else:  # retract to the waiting queue (no backup outside PD): release_req's release + reset
        sim.retract(c, backup=False)
    return slot, wp


@KINDS
@pytest.mark.parametrize("how", ["abort", "retract"])
@pytest.mark.parametrize("next_owner", ["new-request", "copy-on-write", "alloc-group", "cpu-backup-load"])
def test_a_freed_stale_cursor_is_never_seen_by_the_next_owner(kind, how, next_owner):
    """SGLang frees aborted and retracted slots with their cursor as is (the adapter leaves that:
    a free slot's cursor is unobservable). Whatever path hands the slot out next starts it with an
    empty ring, and the new owner's state is exact."""
    with config.override(True):
        sim = Sim(SimConfig(kind=kind, strategy="no_buffer", track_interval=4))
        sim.admit([1, 2, 3, 4, 5, 6], [7])  # a node at depth 6 for copy-on-write
        stale, wp = _stale_free_slot(sim, how)
        assert wp > 0 and int(sim.write_pos[stale]) == wp  # stale while free
        sim.next_mamba_slots([stale])
        if next_owner == "new-request":
            b = sim.admit([4, 4, 4, 4], [1, 2, 3])
        elif next_owner == "copy-on-write":
            b = sim.admit([1, 2, 3, 4, 5, 6, 7, 8], [9, 1, 2])
            assert b.matched == 6
        elif next_owner == "alloc-group":  # the batch pre-allocation match_prefix uses
            alloc = sim.req_pool.mamba_allocator
            alloc.alloc_group_begin(2)
            got = alloc.alloc(1)
            alloc.alloc_group_end()
            assert int(got) == stale and int(sim.write_pos[stale]) == 0
            return
        else:
            a = sim.admit([3, 1, 4, 1, 5], [(j + 2) % 10 for j in range(20)])
            sim.decode_until_pending(a, min_steps=3)
            sim.retract(a, backup=True)
            sim.next_mamba_slots([stale])
            b = a
            assert sim.resume(a) == stale
        assert int(b.req.kv.mamba_pool_idx) == stale
        assert int(sim.write_pos[stale]) == 0
        sim.check()
        sim.decode()
        sim.check()

"""Property-based: random request streams over SGLang's real radix cache and decode-ring pools.

Each example is a fixed-length list of operations (admit with a shared-prefix prompt and
copy-on-write, batched decode, finish, abort, eviction, probe match, copy of a live slot) run on
:class:`tests.support.simulate.Sim` with the adapter on. After every operation:

* every radix node's ``(conv, temporal)`` equals the fp64 recurrence of its token path
  (relative error <= 1e-5) and its ring is empty;
* every running request's checkpoint + ring reproduces its state (and its conv window).

GDN and KDA x no_buffer / extra_buffer / extra_buffer_lazy, with track intervals that divide
the ring length L=4 and that do not, and checkpoint grids 1 and 2, and with records (hits at any
depth, states planted and rebuilt from stored inputs: GDN with a full pool and interval states, GDN
with a 40-token first-in-first-out pool, KDA with a 60-token pool): every planted node is checked
like any other; and with decode rings keyed by request row (three configurations here, two across
the moves below); 20,400 steps in total, derandomised so CI runs the same streams every time.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from sglang_replayssm.radix import config
from sglang_replayssm.radix.records.pool import pool_of
from tests.support.simulate import Sim, SimConfig, rel_err

STEPS = 50  # operations per example
EXAMPLES = 34  # examples per configuration
CONFIGS = [
    SimConfig(kind="gdn", strategy="no_buffer", track_interval=3),
    SimConfig(kind="gdn", strategy="extra_buffer", track_interval=2, chunk=2),
    SimConfig(kind="gdn", strategy="extra_buffer_lazy", track_interval=6),
    SimConfig(kind="kda", strategy="no_buffer", track_interval=4, chunk=2),
    SimConfig(kind="kda", strategy="extra_buffer", track_interval=3),
    SimConfig(kind="kda", strategy="extra_buffer_lazy", track_interval=8),
    # Records (prefix hits at any depth, rebuilt from stored inputs): a pool that holds every
    # token with a prefill state kept every 4 tokens (rebuilds start from the deepest one), and
    # one of 40 tokens whose first-in-first-out eviction makes hits fall back.
    SimConfig(kind="gdn", strategy="extra_buffer", track_interval=2, chunk=2, records=True, state_interval=4),
    SimConfig(kind="gdn", strategy="no_buffer", track_interval=3, records=True, record_tokens=40),
    SimConfig(kind="kda", strategy="extra_buffer", track_interval=3, records=True, record_tokens=60),
    # Decode rings keyed by request row (radix/ring/rows.py): a slot reads its records at its request's row.
    SimConfig(kind="gdn", strategy="no_buffer", track_interval=3, ring_rows=True),
    SimConfig(kind="kda", strategy="extra_buffer", track_interval=3, ring_rows=True),
    SimConfig(kind="gdn", strategy="extra_buffer", track_interval=2, chunk=2, records=True, state_interval=4,
              ring_rows=True),
]
FAMILIES = [
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3],
    [1, 2, 3, 4, 9, 9, 8, 7, 6, 5, 4, 3],
    [5, 4, 3, 2, 1, 5, 4, 3],
]
MAX_RUNNING = 4
_steps_run = {"count": 0, "rebuilds": 0, "state_rebuilds": 0, "host_restored": 0, "hicache_rebuilds": 0}


@pytest.fixture(scope="module", autouse=True)
def _adapter_installed(radix_adapter):
    return radix_adapter


tokens = st.integers(min_value=0, max_value=9)
prompts = st.builds(
    lambda fam, cut, tail: FAMILIES[fam][:cut] + tail,
    st.integers(0, len(FAMILIES) - 1),
    st.integers(1, 12),
    st.lists(tokens, max_size=3),
)
_OP_ARGS = {
    "admit": st.tuples(prompts, st.lists(tokens, min_size=4, max_size=20)),
    "decode": st.tuples(st.integers(-1, 15)),  # -1: every running request, else a bitmask
    "finish": st.tuples(st.integers(0, 7)),
    "abort": st.tuples(st.integers(0, 7)),
    "evict": st.tuples(st.integers(0, 64), st.integers(0, 3)),
    "match": st.tuples(prompts),
    "copy": st.tuples(st.integers(0, 7)),
}
#: Decode-heavy mix: decode 8/16, admit 3/16, copy 2/16, the rest 1/16 each.
_KINDS = ["decode"] * 8 + ["admit"] * 3 + ["copy"] * 2 + ["finish", "abort", "evict", "match"]
ops = st.sampled_from(_KINDS).flatmap(lambda kind: _OP_ARGS[kind].map(lambda args: (kind, *args)))


def _apply(sim: Sim, op: tuple) -> None:
    kind = op[0]
    running = sim.running
    if not running and kind in ("decode", "finish", "abort", "copy"):
        # Keep the stream busy: an op that needs a running request admits one first.
        arg = abs(op[1])
        sim.admit(FAMILIES[arg % len(FAMILIES)][: 4 + arg % 8], [(arg + j) % 10 for j in range(6 + arg % 9)])
        running = sim.running
    if kind == "admit":
        if len(running) < MAX_RUNNING:
            sim.admit(op[1], op[2])
        else:
            sim.decode()
    elif kind == "decode":
        if op[1] >= 0 and running:
            subset = [r for i, r in enumerate(running) if op[1] >> i & 1]
            sim.decode(subset or running[:1])
        else:
            sim.decode()
    elif kind in ("finish", "abort") and running:
        target = running[op[1] % len(running)]
        sim.finish_now(target) if kind == "finish" else sim.abort(target)
    elif kind == "evict":
        sim.evict(num_tokens=op[1], mamba_num=op[2])
    elif kind == "match":
        sim.match(op[1])
    elif kind == "copy" and running:
        # An exact snapshot of a live slot (pending records included) into a fresh slot.
        sreq = running[op[1] % len(running)]
        dst = sim.req_pool.mamba_allocator.alloc(1)
        if dst is not None:
            sim.req_pool.copy_mamba_state(sreq.req.kv.mamba_pool_idx.reshape(1), dst)
            got, want = sim.slot_state(int(dst)), sim.model.oracle(sreq.consumed)
            errs = [rel_err(g, w) for g, w in zip(got, want)]
            assert max(errs) <= 1e-5, f"copy of {sreq.req.rid}: rel err {max(errs):.3g}"
            sim.req_pool.mamba_allocator.free(dst)


def _run(cfg: SimConfig, stream: list[tuple], apply=None, setup=None) -> None:
    sim = Sim(cfg)
    if setup is not None:
        setup(sim)
    try:
        for op in stream:
            (apply or _apply)(sim, op)
            _steps_run["count"] += 1
            sim.check()
    finally:
        _steps_run["rebuilds"] += getattr(sim, "rebuilds", 0)
        _steps_run["state_rebuilds"] += getattr(sim, "state_rebuilds", 0)
        pool = pool_of(sim.req_pool)
        host = None if pool is None or pool.hicache is None else pool.hicache.host
        if host is not None:
            _steps_run["host_restored"] += host.restored
            _steps_run["hicache_rebuilds"] += getattr(sim, "rebuilds", 0)
        if sim.cache.cache_controller is not None:
            sim.cache.release_host_resources()


@pytest.mark.parametrize(
    "cfg", CONFIGS,
    ids=lambda c: f"{c.kind}-{c.strategy}-interval{c.track_interval}-grid{c.chunk}"
    + (f"-records{c.record_tokens}" if c.records else "") + (f"-states{c.state_interval}" if c.state_interval else "")
    + ("-ring-rows" if c.ring_rows else ""),
)
def test_every_cached_and_live_state_is_exact(cfg):
    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(ops, min_size=STEPS, max_size=STEPS))
    def streams(stream):
        with config.override(True):
            _run(cfg, stream)

    streams()


def test_the_suite_ran_enough_steps():
    """Runs after the parametrised cases (file order); 12 x 34 x 50 = 20,400 steps."""
    assert _steps_run["count"] >= 10_000, _steps_run["count"]
    assert _steps_run["rebuilds"] >= 100, _steps_run  # the records configurations plant and rebuild
    assert _steps_run["state_rebuilds"] >= 20, _steps_run  # ... some from a kept prefill state


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_the_same_streams_catch_sglang_without_the_adapter(kind):
    """Sanity check of the oracle: with the adapter off the first stream that finishes a request
    with pending records (no_buffer) or tracks a KDA state (extra_buffer) violates an invariant."""
    strategy = "no_buffer" if kind == "gdn" else "extra_buffer"
    stream = [("admit", FAMILIES[0][:6], [1, 2, 3, 4, 5, 6, 7, 8, 9])] + [("decode", -1)] * 9
    with config.override(False), pytest.raises(AssertionError, match="rel err|conv window"):
        _run(SimConfig(kind=kind, strategy=strategy, track_interval=3), stream)


# ---- the same invariants across the paths that move a running request's state ----------
#
# On top of the ops above: a MIXED forward (decode rows through the extend kernel), a streaming
# session's next turn (extend of the kept slot), retraction with a CPU backup and its resume (PD
# decode), retraction without backup and its recompute (everywhere else), and HiCache: back the
# tree up to host, evict (backed-up nodes move to host), restore a host node by load-back. Every
# retracted request's resumed state, every restored node and every live ring is checked after
# every step (records and request-row rings too). 8 configurations x 20 examples x 50 steps = 8,000 steps.

MOVER_STEPS = 50
MOVER_EXAMPLES = 20
MOVER_CONFIGS = [
    SimConfig(kind="gdn", strategy="no_buffer", track_interval=3, mamba_slots=32),
    SimConfig(kind="kda", strategy="no_buffer", track_interval=4, chunk=2, mamba_slots=32),
    SimConfig(kind="kda", strategy="extra_buffer", track_interval=3, mamba_slots=32),
    SimConfig(kind="gdn", strategy="extra_buffer_lazy", track_interval=6, mamba_slots=32),
    # Records with HiCache (radix/records/hicache/host_records.py): records go to host with their nodes and come
    # back on load-back; hits inside loaded-back nodes are rebuilt from them. A full pool, and a
    # 40-token device pool whose first-in-first-out eviction races the loads.
    SimConfig(kind="gdn", strategy="no_buffer", track_interval=3, mamba_slots=32, records=True),
    SimConfig(kind="gdn", strategy="extra_buffer", track_interval=2, chunk=2, mamba_slots=32, records=True,
              record_tokens=40),
    SimConfig(kind="kda", strategy="no_buffer", track_interval=4, chunk=2, mamba_slots=32, ring_rows=True),
    SimConfig(kind="gdn", strategy="extra_buffer", track_interval=2, chunk=2, mamba_slots=32, records=True,
              ring_rows=True),
]
_MOVER_ARGS = {
    **_OP_ARGS,
    "mixed": st.tuples(st.integers(1, 15)),
    "turn": st.tuples(st.integers(0, 7), st.lists(tokens, min_size=1, max_size=4)),
    "retract": st.tuples(st.integers(0, 7), st.booleans()),
    "resume": st.tuples(st.integers(0, 7)),
    "backup": st.tuples(st.just(0)),
    "restore": st.tuples(prompts),
}
_MOVER_KINDS = (["decode"] * 5 + ["admit"] * 3 + ["mixed"] * 2 + ["turn", "retract", "retract", "resume", "resume"]
                + ["backup", "restore", "evict", "abort", "finish", "copy"])


def _op(kind: str, args: tuple) -> tuple:
    """An operation ``(kind, *args)`` (a named function, so a failing stream prints its ops)."""
    return (kind, *args)


mover_ops = st.sampled_from(_MOVER_KINDS).flatmap(lambda k: _MOVER_ARGS[k].map(functools.partial(_op, k)))
#: Records configurations add ``split``: back the tree up and evict it to host, restore a host path,
#: then admit a prompt that leaves it at ``cut`` (a hit inside loaded-back nodes: rebuilt from the
#: records that came back from host).
_RECORD_MOVER_ARGS = {**_MOVER_ARGS, "split": st.tuples(prompts, st.integers(1, 11), tokens)}
record_mover_ops = st.sampled_from(_MOVER_KINDS + ["split"] * 3).flatmap(
    lambda k: _RECORD_MOVER_ARGS[k].map(functools.partial(_op, k)))


def _hicache_setup(sim: Sim) -> None:
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    from sglang_replayssm.cpu import hooks_hicache

    hooks_hicache.inject_ops()
    cfg = sim.cfg
    overlap = cfg.extra_buffer if cfg.overlap is None else cfg.overlap
    args = ServerArgs(model_path="dummy", page_size=1, mamba_radix_cache_strategy=cfg.strategy,
                      mamba_track_interval=cfg.track_interval, enable_linear_replayssm=True,
                      linear_replayssm_cache_len=cfg.ring_len, disable_overlap_schedule=not overlap,
                      hicache_io_backend="kernel", hicache_mem_layout="page_first", hicache_ratio=2.0)
    args._mamba_cache_chunk_size = cfg.chunk
    set_global_server_args_for_scheduler(args)
    sim.cache.init_hicache(args, sim.cache.cache_init_params)
    sim.cache.write_through_threshold = 1 << 30
    sim.cache.load_back_threshold = 0
    sim.retracted = []


def _backup_tree(sim: Sim) -> None:
    from sglang.test.kits.unified_radix_cache.fixtures import node_children, write_backup

    cache = sim.cache
    stack = list(node_children(cache, cache.root_node_handle()))
    while stack:  # parent first
        node = stack.pop()
        if not cache.tree_core.is_backuped(node):
            write_backup(cache, node, write_back=True)
        stack.extend(node_children(cache, node))
    cache.writing_check(write_back=True)


def _apply_mover(sim: Sim, op: tuple) -> None:
    kind, running = op[0], sim.running
    if kind in ("mixed", "turn") and not running:
        kind = "admit_default"
    if kind == "admit_default" or (kind == "admit" and len(running) >= MAX_RUNNING):
        _apply(sim, ("decode", -1))
    elif kind == "mixed":
        rows = [r for i, r in enumerate(running) if op[1] >> i & 1] or running[:1]
        sim.extend_running([(r, []) for r in rows], "MIXED")
    elif kind == "turn":
        sim.extend_running([(running[op[1] % len(running)], op[2])], "EXTEND")
    elif kind == "retract":
        if running:
            target = running[op[1] % len(running)]
            sim.retract(target, backup=op[2])
            sim.retracted.append((target, op[2]))
    elif kind == "resume":
        if sim.retracted:
            target, backup = sim.retracted.pop(op[1] % len(sim.retracted))
            if backup:
                slot = sim.resume(target)
                assert int(sim.write_pos[slot]) == 0
            else:
                sim.recompute(target)
        else:
            _apply(sim, ("decode", -1))
    elif kind == "backup":
        _backup_tree(sim)
    elif kind in ("restore", "split"):
        if kind == "split":  # the whole unlocked tree goes to host first
            _backup_tree(sim)
            sim.evict(num_tokens=sim.cfg.kv_size, mamba_num=sim.cfg.mamba_slots)
        match = sim.match(op[1])
        if match.host_hit_length > 0 and sim.cache.load_back(match.best_match_node):
            assert sim.cache.ready_to_load_host_cache() != -1
            for ack in list(sim.cache.cache_controller.ack_load_queue):
                ack.finish_event.synchronize()
            sim.cache.loading_check()
        if kind == "split" and len(running) < MAX_RUNNING:
            cut = min(op[2], len(op[1]))
            sim.admit(op[1][:cut] + [op[3]], [op[3], 1, 2, 3])
    else:
        _apply(sim, op)


@pytest.mark.parametrize(
    "cfg", MOVER_CONFIGS, ids=lambda c: f"{c.kind}-{c.strategy}-interval{c.track_interval}-grid{c.chunk}"
    + (f"-records{c.record_tokens}" if c.records else "") + ("-ring-rows" if c.ring_rows else "")
)
def test_every_state_is_exact_across_moves(cfg, monkeypatch):
    from sglang.srt.mem_cache.pool_host import common

    monkeypatch.setattr(common, "_cuda_host_register", lambda *a, **k: None)  # no driver on CPU

    @settings(
        max_examples=MOVER_EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(record_mover_ops if cfg.records else mover_ops, min_size=MOVER_STEPS, max_size=MOVER_STEPS))
    def streams(stream):
        with config.override(True):
            _run(cfg, stream, apply=_apply_mover, setup=_hicache_setup)

    streams()


def test_the_mover_streams_bring_records_back_from_host():
    """Runs after the mover cases (file order): the records + HiCache configurations restored
    records from host and rebuilt planted states."""
    assert _steps_run["host_restored"] >= 100, _steps_run
    assert _steps_run["hicache_rebuilds"] >= 20, _steps_run


@pytest.mark.parametrize(
    "fix, stream",
    [
        ("extend_fold", [("admit", FAMILIES[0][:6], list(range(1, 10)))] + [("decode", -1)] * 2 + [("mixed", 1)]),
        ("extend_fold", [("admit", FAMILIES[1][:5], list(range(1, 10)))] + [("decode", -1)] * 2 + [("turn", 0, [4, 5])]),
        ("retract_backup", [("admit", FAMILIES[2][:4], list(range(1, 10)))] + [("decode", -1)] * 2
         + [("retract", 0, True), ("resume", 0)]),
    ],
    ids=["mixed-without-extend_fold", "session-turn-without-extend_fold", "cpu-backup-without-retract_backup"],
)
def test_the_mover_streams_catch_each_fix_switched_off(fix, stream, monkeypatch):
    """Sanity check of the new ops: each fails the invariants with its fix off (records pending
    after 2 decode steps at L=4), and passes with it on."""
    from sglang.srt.mem_cache.pool_host import common

    monkeypatch.setattr(common, "_cuda_host_register", lambda *a, **k: None)
    cfg = SimConfig(kind="gdn", strategy="no_buffer", track_interval=5, mamba_slots=32)
    with config.override(True):
        _run(cfg, stream, apply=_apply_mover, setup=_hicache_setup)
    with config.override(True, **{fix: False}), pytest.raises(AssertionError, match="rel err"):
        _run(cfg, stream, apply=_apply_mover, setup=_hicache_setup)

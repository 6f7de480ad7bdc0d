"""The decode-metadata hooks: the ``device_cursor`` fix (SGLang's decode cursor advance moved onto
the device) composed with the ``kda_force_flush`` fix.

Driven on CPU through SGLang 0.5.23's real ``MambaAttnBackendBase`` decode metadata
(``_forward_metadata`` eager, ``init_forward_metadata_out_graph`` -> ``_replay_metadata`` for CUDA
graphs, with the per-bs static buffers from its own ``init_cuda_graph_state``) on a real
``HybridReqToTokenPool`` / ``MambaPool`` with the decode ring (built by the simulation's fixture).
Each step runs once with the fix off (SGLang's host-side advance) and once with it on, from the
same cursors: what the decode kernel receives (write_pos snapshot, force-flush mask, the static
buffers it was captured with) and the pool cursors afterwards must be identical, over random
batches with padding, rows sharing a slot, slot re-allocation, track boundaries, GDN and KDA (with
and without the KDA force-flush fix), captures and verify replays. The on path must not touch the
host lengths or run any op that reads device data on the host.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sglang_replayssm import hook_table
from sglang_replayssm.radix import config, hooks
from sglang_replayssm.radix.ring import decode_metadata
from sglang_replayssm.radix.ring import hooks as ring_hooks
from sglang_replayssm.radix.ring.pool import ring_pool

MAX_BS = 12


@pytest.fixture(scope="module", autouse=True)
def _adapter_installed() -> None:
    hooks.install()


def _backend_module() -> Any:
    from sglang.srt.layers.attention import hybrid_linear_attn_backend

    return hybrid_linear_attn_backend


def _mode(name: str) -> Any:
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return ForwardMode[name]


@functools.cache
def _backend_cls() -> type:
    base = _backend_module().MambaAttnBackendBase

    class Backend(base):  # type: ignore[misc, valid-type]
        """SGLang's mamba backend base with the attributes its decode metadata reads (its own
        ``__init__`` needs a ModelRunner); CUDA-graph state from its own ``init_cuda_graph_state``."""

        def __init__(self, req_to_token_pool: Any, graph: bool) -> None:  # no super().__init__
            self.device = "cpu"
            self.req_to_token_pool = req_to_token_pool
            self.forward_metadata = None
            self.topk = 0
            self.pad_slot_id = -1
            self._fused_state_indices_ok = False
            self._graph_seq_len_fill_value = 1
            self.state_indices_list = []
            self.query_start_loc_list = []
            self.retrieve_next_token_list = []
            self.retrieve_next_sibling_list = []
            self.retrieve_parent_token_list = []
            self.replayssm_write_pos_list = None
            self.replayssm_force_flush_list = None
            if graph:
                self.init_cuda_graph_state(MAX_BS, MAX_BS)

    return Backend


def _pool(kind: str, ring_len: int, interval: int) -> Any:
    from tests.support.simulate import SimConfig, ToyModel, build_fixture

    cfg = SimConfig(kind=kind, ring_len=ring_len, track_interval=interval, mamba_slots=24, max_reqs=16)
    _, _, req_pool = build_fixture(cfg, ToyModel(cfg))
    assert req_pool.mamba_pool.replayssm_is_kda == (kind == "kda")
    return req_pool


@contextmanager
def _track_interval(interval: int) -> Iterator[None]:
    module = _backend_module()
    saved = module.get_exec
    module.get_exec = lambda: SimpleNamespace(mamba=SimpleNamespace(mamba_track_interval=interval))
    try:
        yield
    finally:
        module.get_exec = saved


class _World:
    """Requests on req-pool rows 1.. with persistent slots and lengths; row 0 is SGLang's padding
    row (mamba slot 0)."""

    def __init__(self, req_pool: Any, seed: int, ring_len: int, interval: int):
        self.req_pool = req_pool
        self.pool = req_pool.mamba_pool
        self.rng = random.Random(seed)
        self.L = ring_len
        self.interval = interval
        n_rows = req_pool.req_index_to_mamba_index_mapping.shape[0]
        self.free = list(range(1, self.pool.size + 1))
        self.rng.shuffle(self.free)
        self.seq: dict[int, int] = {}
        req_pool.req_index_to_mamba_index_mapping[0] = 0
        for row in range(1, n_rows):
            self._alloc(row)
        g = torch.Generator().manual_seed(seed)
        self.pool.replayssm_write_pos.copy_(torch.randint(0, ring_len, self.pool.replayssm_write_pos.shape, generator=g))

    def _alloc(self, row: int) -> None:
        mapping = self.req_pool.req_index_to_mamba_index_mapping
        if row in self.seq:
            self.free.append(int(mapping[row]))
        slot = self.free.pop(0)
        mapping[row] = slot
        self.pool.replayssm_write_pos[slot] = 0  # what the allocator (cursor_reset) does
        self.seq[row] = self.rng.randrange(1, 3 * self.interval * self.L)

    def batch(self) -> list[int]:
        """Rows of the next decode batch (a row may appear twice: rows sharing a slot agree)."""
        rng = self.rng
        if rng.random() < 0.1:
            self._alloc(rng.choice(sorted(self.seq)))  # a finished request's row gets a new slot
        rows = rng.sample(sorted(self.seq), rng.randint(1, min(8, len(self.seq))))
        if rng.random() < 0.3:
            rows.insert(rng.randrange(len(rows) + 1), rng.choice(rows))
        return rows

    def advance(self, rows: list[int]) -> None:
        for row in set(rows):
            self.seq[row] += 1


def _eager_batch(world: _World, rows: list[int], pad: int, host_lens: bool = True) -> SimpleNamespace:
    lens = [world.seq[r] for r in rows] + [1] * pad
    idle = not rows and not pad
    mode = _mode("IDLE" if idle else "DECODE")
    return SimpleNamespace(
        batch_size=len(lens),
        forward_mode=mode,
        logical_forward_mode=mode,
        req_pool_indices=torch.tensor(rows + [0] * pad, dtype=torch.int64),
        seq_lens=torch.tensor(lens, dtype=torch.int64),
        seq_lens_cpu=torch.tensor(lens, dtype=torch.int64) if host_lens else None,
        mamba_track_indices=None,
        mamba_track_mask=None,
        mamba_prefill_track_mask_cpu=None,
        mamba_track_seqlens_cpu=None,
        extend_seq_lens_cpu=None,
        extend_prefix_lens_cpu=None,
    )


def _graph_batch(world: _World, rows: list[int], bs: int, mode: str = "DECODE") -> SimpleNamespace:
    pad = bs - len(rows)
    lens = [world.seq[r] for r in rows] + [1] * pad
    return SimpleNamespace(
        batch_size=bs,
        forward_mode=_mode(mode),
        req_pool_indices=torch.tensor(rows + [0] * pad, dtype=torch.int64),
        seq_lens=torch.tensor(lens, dtype=torch.int64),
        seq_lens_cpu=torch.tensor(lens, dtype=torch.int64),
        num_padding=pad,
        spec_info=None,
        mamba_track_indices=None,
    )


def _clone(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.clone()


def _assert_same(a: torch.Tensor | None, b: torch.Tensor | None, what: str) -> None:
    assert (a is None) == (b is None), what
    if a is not None and b is not None:
        assert a.dtype == b.dtype and a.device == b.device, what
        assert torch.equal(a, b), f"{what}: {a.tolist()} != {b.tolist()}"


def _run_both(world: _World, step: Any) -> tuple[Any, torch.Tensor | None, torch.Tensor | None]:
    """``step()`` from the same cursors with the fix off, then on; checks the kernel's inputs and
    the cursors after agree; returns the on-path metadata and its (write_pos, force_flush)."""
    write_pos = world.pool.replayssm_write_pos
    before = write_pos.clone()
    with config.override(device_cursor=False):
        meta = step()
    ref = (_clone(meta.replayssm_write_pos), _clone(meta.replayssm_force_flush), meta.mamba_cache_indices.clone())
    ref_after = write_pos.clone()
    write_pos.copy_(before)
    with config.override(device_cursor=True):
        meta = step()
    assert world.pool.replayssm_write_pos is write_pos
    _assert_same(meta.replayssm_write_pos, ref[0], "write_pos snapshot")
    _assert_same(meta.replayssm_force_flush, ref[1], "force_flush")
    _assert_same(meta.mamba_cache_indices, ref[2], "slots")
    _assert_same(write_pos, ref_after, "pool cursors after the step")
    return meta, meta.replayssm_write_pos, meta.replayssm_force_flush


CONFIGS = [
    pytest.param("gdn", True, 4, 4, id="gdn-L4-i4"),
    pytest.param("gdn", True, 5, 3, id="gdn-L5-i3"),
    pytest.param("kda", True, 4, 3, id="kda-fix-L4-i3"),
    pytest.param("kda", False, 5, 4, id="kda-nofix-L5-i4"),
]


def _counts(stats: dict[str, int], wp: torch.Tensor | None, ff: torch.Tensor | None, L: int) -> None:
    if wp is not None:
        stats["wraps"] += int((wp == L - 1).sum())
    if ff is not None:
        stats["forced"] += int((ff != 0).sum())


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize(("kind", "kda_fix", "ring_len", "interval"), CONFIGS)
def test_eager_matches_sglang(kind: str, kda_fix: bool, ring_len: int, interval: int, impl: str, monkeypatch) -> None:
    monkeypatch.setattr(decode_metadata, "cursor_step", functools.partial(decode_metadata.cursor_step, impl=impl))
    world = _World(_pool(kind, ring_len, interval), seed=11 + ring_len, ring_len=ring_len, interval=interval)
    backend = _backend_cls()(world.req_pool, graph=False)
    stats = {"wraps": 0, "forced": 0, "padded": 0, "shared": 0}
    steps = 300 if impl == "torch" else 60
    with _track_interval(interval), config.override(kda_force_flush=kda_fix):
        for _ in range(steps):
            roll = world.rng.random()
            if roll < 0.03:
                rows, pad = [], 0  # idle
            else:
                rows = world.batch()
                pad = world.rng.choice([0, 0, 1, 3])
            host_lens = world.rng.random() > 0.05
            fb = _eager_batch(world, rows, pad, host_lens)
            meta, wp, ff = _run_both(world, lambda fb=fb: backend._forward_metadata(fb))
            stats["padded"] += pad
            stats["shared"] += len(rows) - len(set(rows))
            _counts(stats, wp, ff, ring_len)
            if kind == "kda" and not kda_fix:
                assert ff is None
            else:
                assert ff is not None and ff.dtype == torch.int32
            world.advance(rows)
    assert stats["wraps"] > 0 and stats["padded"] > 0 and stats["shared"] > 0, stats
    assert (stats["forced"] > 0) == (kind == "gdn" or kda_fix), stats


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize(("kind", "kda_fix", "ring_len", "interval"), CONFIGS)
def test_cuda_graph_replay_matches_sglang(
    kind: str, kda_fix: bool, ring_len: int, interval: int, impl: str, monkeypatch
) -> None:
    monkeypatch.setattr(decode_metadata, "cursor_step", functools.partial(decode_metadata.cursor_step, impl=impl))
    world = _World(_pool(kind, ring_len, interval), seed=5 + ring_len, ring_len=ring_len, interval=interval)
    backend = _backend_cls()(world.req_pool, graph=True)
    stats = {"wraps": 0, "forced": 0, "padded": 0, "shared": 0}
    steps = 300 if impl == "torch" else 60
    with _track_interval(interval), config.override(kda_force_flush=kda_fix):
        for _ in range(steps):
            rows = world.batch()
            bs = world.rng.randint(len(rows), MAX_BS)
            roll = world.rng.random()
            mode, in_capture, host_lens = "DECODE", False, True
            if roll < 0.05:
                in_capture = True  # snapshot only, nothing advances
            elif roll < 0.1:
                mode, bs = "TARGET_VERIFY", len(rows)  # the ring never advances on a verify replay
            elif roll < 0.15:
                host_lens = False  # a batch without host lengths: SGLang never force-flushes it

            def step(rows: list[int] = rows, bs: int = bs, mode: str = mode, in_capture: bool = in_capture,
                     host_lens: bool = host_lens) -> Any:
                for buf in backend.replayssm_write_pos_list + backend.replayssm_force_flush_list:
                    buf.fill_(-7)  # SGLang rewrites this step's buffers whole; stale content must not leak
                fb = _graph_batch(world, rows, bs, mode)
                if not host_lens:
                    fb.seq_lens_cpu = None
                backend.init_forward_metadata_out_graph(fb, in_capture=in_capture)
                return backend.forward_metadata

            before = world.pool.replayssm_write_pos.clone()
            meta, wp, ff = _run_both(world, step)
            # the kernel reads SGLang's captured per-bs buffers, refreshed in place
            assert wp is backend.replayssm_write_pos_list[bs - 1]
            assert ff is backend.replayssm_force_flush_list[bs - 1]
            if in_capture or mode != "DECODE":
                assert torch.equal(world.pool.replayssm_write_pos, before) and not bool(ff.any())
                continue
            stats["padded"] += bs - len(rows)
            stats["shared"] += len(rows) - len(set(rows))
            _counts(stats, wp[: len(rows)], ff[: len(rows)], ring_len)
            world.advance(rows)
    assert stats["wraps"] > 0 and stats["padded"] > 0 and stats["shared"] > 0, stats
    assert (stats["forced"] > 0) == (kind == "gdn" or kda_fix), stats


# ---- no host sync -------------------------------------------------------------------------------

_SYNC_OPS = {
    "_local_scalar_dense",  # .item(), int()/float()/bool() of a tensor
    "item",
    "is_nonzero",
    "equal",
    "allclose",
    "nonzero",
    "masked_select",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "repeat_interleave",
}


class _SyncDetector(TorchDispatchMode):
    """Records every op that reads device data on the host or has a data-dependent output shape
    (which needs the data on the host): scalar reads, unique, nonzero, masked_select, and
    indexing / index_put with boolean masks."""

    def __init__(self) -> None:
        super().__init__()
        self.hits: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if name in _SYNC_OPS:
            self.hits.append(name)
        elif name in ("index", "index_put", "index_put_", "_index_put_impl_"):
            indices = args[1] if len(args) > 1 else ()
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()):
                self.hits.append(f"{name}[bool mask]")
        return func(*args, **(kwargs or {}))


class _HostOnly(torch.Tensor):
    """A host tensor no op may read (``seq_lens_cpu`` on the device path)."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise AssertionError(f"the device path read seq_lens_cpu ({func})")


def _no_tolist(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("tolist() on the device path")


@pytest.mark.parametrize("path", ["eager", "graph"])
@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_device_path_reads_nothing_on_the_host(path: str, kind: str, monkeypatch) -> None:
    interval, L = 3, 4
    world = _World(_pool(kind, L, interval), seed=3, ring_len=L, interval=interval)
    backend = _backend_cls()(world.req_pool, graph=path == "graph")
    with _track_interval(interval), config.override(kda_force_flush=True):
        for fix in (False, True):
            rows = world.batch()
            fb = _eager_batch(world, rows, 2) if path == "eager" else _graph_batch(world, rows, MAX_BS)
            if fix:
                fb.seq_lens_cpu = fb.seq_lens_cpu.as_subclass(_HostOnly)
            detector = _SyncDetector()
            with config.override(device_cursor=fix), monkeypatch.context() as m:
                if fix:
                    m.setattr(torch.Tensor, "tolist", _no_tolist)
                with detector:
                    if path == "eager":
                        meta = backend._forward_metadata(fb)
                    else:
                        backend.init_forward_metadata_out_graph(fb)
                        meta = backend.forward_metadata
            assert meta.replayssm_force_flush is not None
            if fix:
                assert detector.hits == [], detector.hits
            else:  # the detector sees SGLang's host-side advance
                assert any("unique" in h for h in detector.hits) and any("bool mask" in h for h in detector.hits)
            world.advance(rows)


def test_device_path_adds_no_sync_to_a_tracked_eager_batch() -> None:
    """With extra_buffer's decode track mask SGLang's eager metadata reads ``mask.any()`` on the
    host itself; with the fix on, the metadata call reads exactly what it reads without a ring."""
    interval, L = 4, 4
    world = _World(_pool("gdn", L, interval), seed=8, ring_len=L, interval=interval)
    backend = _backend_cls()(world.req_pool, graph=False)
    pool = world.pool

    def run() -> list[str]:
        fb = _eager_batch(world, world.batch(), 1)
        fb.mamba_track_mask = torch.tensor([s % interval == 0 for s in fb.seq_lens.tolist()])
        fb.mamba_track_indices = torch.zeros(fb.batch_size, dtype=torch.int64)
        detector = _SyncDetector()
        with detector:
            backend._forward_metadata(fb)
        return detector.hits

    with _track_interval(interval), config.override(device_cursor=True):
        with_ring = run()
        pool.enable_linear_replayssm = False
        try:
            without_ring = run()
        finally:
            pool.enable_linear_replayssm = True
    assert with_ring == without_ring and with_ring, (with_ring, without_ring)


# ---- pass-through and composition ---------------------------------------------------------------


def _ring_namespace(write_pos: torch.Tensor | None, enabled: bool = True, kda: bool = False) -> SimpleNamespace:
    """A stand-in decode-ring pool: flags, cursor and (empty) ring tensors, nothing else."""
    ring = torch.zeros(1, 3, 1, 2, *((1,) if kda else ()))
    cache = SimpleNamespace(replayssm_d=ring, replayssm_k=ring, replayssm_g=ring)
    return SimpleNamespace(replayssm_write_pos=write_pos, enable_linear_replayssm=enabled, mamba_cache=cache,
                           replayssm_is_kda=kda)


@pytest.mark.parametrize(
    "pool",
    [
        None,
        _ring_namespace(torch.zeros(3, dtype=torch.int32), enabled=False),
        _ring_namespace(None),
    ],
    ids=["no-mamba-pool", "spec-ring", "no-cursor"],
)
def test_passes_through_without_the_decode_ring(pool: Any) -> None:
    backend = SimpleNamespace(req_to_token_pool=SimpleNamespace(mamba_pool=pool), replayssm_write_pos_list=[])
    fb = SimpleNamespace(logical_forward_mode=_mode("DECODE"), forward_mode=_mode("DECODE"))
    seen = []
    cursor = getattr(pool, "replayssm_write_pos", None)

    def original(*args: Any, **kwargs: Any) -> str:
        seen.append((args, kwargs))
        assert getattr(pool, "replayssm_write_pos", None) is cursor  # not hidden
        return "sglang"

    assert decode_metadata.device_forward_metadata(original, backend, fb) == "sglang"
    assert decode_metadata.device_out_graph_metadata(original, backend, fb, in_capture=True) == "sglang"
    assert seen == [((backend, fb), {}), ((backend, fb), {"in_capture": True})]


def test_one_hook_per_metadata_entry_point() -> None:
    backend = "sglang.srt.layers.attention.hybrid_linear_attn_backend.MambaAttnBackendBase"
    for entry, fn in (("_forward_metadata", ring_hooks.decode_metadata_eager),
                      ("init_forward_metadata_out_graph", ring_hooks.decode_metadata_graph),
                      ("_replay_metadata", None)):
        chain = hook_table.wrapped_hooks(hook_table.live_attr(f"{backend}.{entry}"))
        assert chain == ([] if fn is None else [fn]), entry


@pytest.mark.parametrize("device_fix", [True, False], ids=["device-cursor", "sglang-cursor"])
@pytest.mark.parametrize("kda_fix", [True, False], ids=["kda-flush", "no-kda-flush"])
@pytest.mark.parametrize("mode", ["DECODE", "EXTEND"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_kda_flag_and_cursor_hidden_only_inside_sglang(graph: bool, mode: str, kda_fix: bool, device_fix: bool) -> None:
    """The KDA flag is lowered around SGLang's metadata call (outer) with the cursor hidden inside
    it only while ``device_cursor`` is on; both are restored afterwards, also when SGLang raises."""
    pool = _ring_namespace(torch.zeros(3, dtype=torch.int32), kda=True)
    cursor = pool.replayssm_write_pos
    backend = SimpleNamespace(req_to_token_pool=SimpleNamespace(mamba_pool=pool), replayssm_write_pos_list=[])
    fb = SimpleNamespace(logical_forward_mode=_mode(mode), forward_mode=_mode(mode))
    seen = []

    def original(_backend: Any, _fb: Any) -> str:
        seen.append((pool.replayssm_is_kda, pool.replayssm_write_pos is None))
        raise RuntimeError("boom")

    hook = ring_hooks.decode_metadata_graph if graph else ring_hooks.decode_metadata_eager
    with config.override(kda_force_flush=kda_fix, device_cursor=device_fix), pytest.raises(RuntimeError, match="boom"):
        hook(original, backend, fb)
    # the eager path passes an extend batch through with the cursor visible; the graph path hides
    # the cursor for any mode (it refreshes the snapshot on a non-decode replay)
    assert seen == [(not kda_fix, device_fix and (graph or mode == "DECODE"))]
    assert pool.replayssm_is_kda is True and pool.replayssm_write_pos is cursor


def test_force_flush_rule_reads_the_flag_the_kda_fix_lowers() -> None:
    gdn, kda = _ring_namespace(torch.zeros(3, dtype=torch.int32)), _ring_namespace(torch.zeros(3, dtype=torch.int32), kda=True)
    views = [ring_pool(p) for p in (gdn, kda)]
    assert views[0] is not None and views[1] is not None and views[1].is_kda and not views[0].is_kda
    assert decode_metadata.force_flush_on(views[0]) and not decode_metadata.force_flush_on(views[1])
    with decode_metadata.kda_flag_lowered(views[1]):
        assert decode_metadata.force_flush_on(views[1])
    assert kda.replayssm_is_kda is True

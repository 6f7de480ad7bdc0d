"""Per-layer launches of the records room around a prefill (``tests/support/launch_count.py``): a prefix hit's
rebuild and a prefill's capture do once per forward what does not depend on the layer, with results bit for
bit those of the per-layer tensors the unit tests' pools keep (fp32, CPU).

Cheap (no server): SGLang's CPU pools with 2 to 4 toy GDN layers, the Triton conv interpreted.
"""

from __future__ import annotations

import types

import torch

from sglang_replayssm.radix.records.pool import RecordPool
from tests.support.launch_count import run_capture, run_rebuild, slope


def test_a_rebuild_launches_per_layer_only_the_layers_own_work(radix_adapter):
    """Nothing per GDN layer: the start states' copy, the ``x``, ``a``, ``b`` gathers, the conv (every layer's
    channels side by side) with its windows' gather and write-back, the conv rows past the lead, the gates and
    the extend (every layer's spans as one varlen call over the pool's state stack) are once per forward."""
    per_layer, _, big = slope(run_rebuild)
    assert per_layer == 0, dict(big.launches)
    assert big.launches["index_put_.default"] == 2  # the interval states, the conv windows: every layer at once
    assert big.launches["KERNEL extend"] == 1 and big.launches["KERNEL gates"] == 1
    assert big.launches["KERNEL conv"] == 1


def test_per_layer_pools_fold_each_layer_with_its_own_extend(radix_adapter):
    """Layers whose states are not rows of one stack (hand-built pools) keep one conv and extend per layer."""
    counter, _ = run_rebuild(3, stacked=False)
    assert counter.launches["KERNEL extend"] == 3 and counter.launches["KERNEL gates"] == 3
    assert counter.launches["KERNEL conv"] == 3


def test_a_capture_launches_per_layer_only_the_layers_own_work(radix_adapter):
    """Per GDN layer: the ``x`` write and the kept states (one sequence's are evenly spaced chunks: one copy from a
    view of ``h``, kept in ``h``'s dtype, no widening); the ``a``, ``b`` writes of every layer are two ``index_copy_``
    at the forward's last layer; the rows of the forward's tokens and kept states are found once (a gather and a
    remainder each, no ``where``)."""
    per_layer, _, big = slope(run_capture)
    assert per_layer == 2, dict(big.launches)
    assert "where.self" not in big.launches and big.launches["remainder.Scalar"] == 2
    assert big.launches["stack.default"] == 2


def test_stacked_layers_give_the_per_layer_results(radix_adapter):
    """Captures bit for bit; rebuilds: conv windows bit for bit, states to fp32 rounding (the CPU chunk
    kernel's products depend on the batch; on CUDA, bit for bit: ``tests/test_rebuild_stacked.py``)."""
    (_, fused), (_, per_layer) = run_capture(3, stacked=True), run_capture(3, stacked=False)
    assert fused.keys() == per_layer.keys() and len(fused) == 3
    for lid in fused:
        assert all(torch.equal(f, p) for f, p in zip(fused[lid], per_layer[lid])), lid
    (_, fused), (_, per_layer) = run_rebuild(3, stacked=True, mixed=True), run_rebuild(3, stacked=False, mixed=True)
    assert fused.keys() == per_layer.keys() and len(fused) == 3
    for lid, ((state, window), (state_ref, window_ref)) in ((lid, (fused[lid], per_layer[lid])) for lid in fused):
        assert torch.equal(window, window_ref), lid
        torch.testing.assert_close(state, state_ref, rtol=1e-6, atol=1e-6)


def test_evenly_spaced_kept_chunks_are_copied_from_a_view():
    """One sequence keeps a state every ``interval // chunk`` chunks: a slice of ``h`` (a view: one copy a layer);
    a batch's uneven chunks keep the gather; the same rows either way."""
    from sglang_replayssm.radix.records.interval_states import IntervalStates, even_slice
    from tests.support.launch_count import OpCounter

    assert even_slice([4, 8, 12]) == slice(4, 13, 4) and even_slice([3]) == slice(3, 4, 1)
    assert even_slice([4, 9, 13]) is None and even_slice([]) is None
    states = IntervalStates(kv_size=16, capacity=4, interval=256, device=torch.device("cpu"), rounded=True)
    h, dest = torch.randn(12, 2, 3, 3), torch.tensor([0, 2, 1])
    counts = []
    for layer_id, chunks in enumerate((slice(1, 10, 4), torch.tensor([1, 5, 9]))):
        states.write_rows(layer_id, dest, h, chunks, torch.float32)  # allocates the layer's rows
        with OpCounter() as counter:
            states.write_rows(layer_id, dest, h, chunks, torch.float32)
        counts.append(counter.total())
    assert counts == [1, 2]
    assert torch.equal(states.ssm[0], states.ssm[1]) and torch.equal(states.ssm[0][dest], h[1:10:4])


def _stacked_pool(layers: int = 3) -> RecordPool:
    pool = RecordPool(kv_size=32, capacity=16, device=torch.device("cpu"))
    pool.layer_ids = tuple(range(layers))
    return pool


def _write_forward(pool: RecordPool, kv: torch.Tensor, layers: range, a_of=lambda t: t, dest=None) -> list[tuple]:
    """One forward's capture writes (every layer the same ``kv`` and rows ``dest``, found once per forward);
    returns each layer's inputs."""
    dest = pool.dest_of(kv) if dest is None else dest
    inputs = []
    for lid in layers:
        x, a, b = torch.full((kv.numel(), 4), float(lid)), torch.randn(kv.numel(), 2), torch.randn(kv.numel(), 2)
        pool.write(types.SimpleNamespace(layer_id=lid), types.SimpleNamespace(), kv, x, a_of(a), b, dest, stage=True)
        inputs.append((x, a, b))
    return inputs


def test_staged_gate_inputs_are_written_at_the_last_layer():
    pool = _stacked_pool()
    first, kv = torch.tensor([1]), torch.tensor([3, 5, 9])
    pool.assign(torch.cat([first, kv]))
    _write_forward(pool, first, range(3))  # the first forward creates the layers' records
    dest = pool.dest_of(kv)
    inputs = _write_forward(pool, kv, range(2), dest=dest)
    assert len(pool.staged) == 2 and not pool.layers[0].a[pool.slots(kv)].any()  # kept, not yet written
    inputs += _write_forward(pool, kv, range(2, 3), dest=dest)  # the same forward's last layer
    assert not pool.staged and pool.staged_at is None
    slots = pool.slots(kv)
    for lid, (_, a, b) in enumerate(inputs):
        rec = pool.layers[lid]
        assert rec.stack_row == lid and torch.equal(rec.a[slots], a) and torch.equal(rec.b[slots], b)


def test_a_forward_that_stops_before_its_last_layer_loses_its_records():
    """Staged rows are never read half written: the next forward (or the rebuild before it) drops the
    tokens of a forward whose last stacked layer never came."""
    pool = _stacked_pool()
    first, kv, later = torch.tensor([1]), torch.tensor([3, 5, 9]), torch.tensor([11, 12])
    pool.assign(torch.cat([first, kv, later]))
    _write_forward(pool, first, range(3))  # every layer has records: layer 2 ends a forward
    _write_forward(pool, kv, range(2))
    assert pool.covered(kv) and pool.staged
    _write_forward(pool, later, range(3))
    assert not pool.covered(kv) and pool.covered(later) and not pool.staged
    _write_forward(pool, later, range(1))
    pool.settle()
    assert not pool.covered(later)


def test_a_view_of_a_large_output_is_written_at_once():
    """A gate input that would pin a larger buffer until the last layer is not staged (an own tensor is)."""
    pool = _stacked_pool(layers=2)
    first, kv = torch.tensor([1]), torch.tensor([2, 4])
    pool.assign(torch.cat([first, kv]))
    _write_forward(pool, first, range(2))
    (_, a, _), = _write_forward(pool, kv, range(1), a_of=lambda t: torch.cat([t, torch.zeros(2, 6)], 1)[:, :2])
    assert not pool.staged and torch.equal(pool.layers[0].a[pool.slots(kv)], a)
    _write_forward(pool, kv, range(1))
    assert len(pool.staged) == 1


def test_a_refresh_moves_every_stacked_layer_at_once():
    """``refresh`` on stacked records: the ``x`` stack's rows and the ``a``, ``b`` stacks' (one tensor) move in one
    gather and one write each (four copies for every layer, not six a layer), every layer's ``x``, ``a``, ``b`` as a
    layer-by-layer move leaves them; with a transient bound below one stack's moved rows, the stacks move in groups
    of layers, to the same result."""
    from sglang_replayssm.radix import config
    from sglang_replayssm.radix.records import match
    from tests.support.launch_count import OpCounter

    results = []
    for bound in (match.REFRESH_TRANSIENT_BYTES, 1):
        torch.manual_seed(0)  # the same gate inputs in both pools
        pool = _stacked_pool(layers=4)
        kv = torch.tensor([3, 5, 9, 11])
        pool.assign(torch.cat([torch.tensor([1]), kv]))
        _write_forward(pool, torch.tensor([1]), range(4))
        inputs = _write_forward(pool, kv, range(4))
        counter = OpCounter()
        with config.override(True), counter:
            match.REFRESH_TRANSIENT_BYTES, saved = bound, match.REFRESH_TRANSIENT_BYTES
            try:
                assert match.refresh(pool, kv)
            finally:
                match.REFRESH_TRANSIENT_BYTES = saved
        gathers = counter.launches["index_select.default"]
        assert gathers == (2 if bound > 1 else 8), dict(counter.launches)
        assert counter.launches["index_copy_.default"] == gathers + 1  # and the FIFO's own write (fifo.py)
        slots = pool.slots(kv)
        assert slots.tolist() == [(5 + i) % 16 for i in range(4)]  # the young end
        for lid, (x, a, b) in enumerate(inputs):
            rec = pool.layers[lid]
            assert torch.equal(rec.x[slots], x) and torch.equal(rec.a[slots], a) and torch.equal(rec.b[slots], b)
        results.append(torch.cat([pool.xs.flatten(), pool.ab[0].flatten(), pool.ab[1].flatten()]))
    assert torch.equal(results[0], results[1])

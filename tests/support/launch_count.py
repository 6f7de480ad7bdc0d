"""The torch ops the records room issues around a prefill, counted on CPU (``lab/scripts/count_prefill_launches.py``,
``tests/test_radix_records_launches.py``).

Two phases, each the product's own calls on SGLang's real CPU pools (:func:`tests.support.simulate.build_fixture`):

* :func:`run_rebuild`: a prefix hit landing off the state grid (an interval state, its conv lead, the records up
  to the hit's depth) folded by :func:`~sglang_replayssm.radix.records.rebuild.rebuild`; ``mixed`` adds a hit
  from a tree state and one from the root to the same call;
* :func:`run_capture`: a plain prefill's capture, per GDN layer :func:`capture.capture` (the layer inputs into
  the record pool) and :func:`capture.keep_chunk_states` (the kept interval states; ``h`` in bf16, widened as
  in bf16 serving). The first forward allocates the layers' records; the second is counted.

SGLang's kernels (``causal_conv1d_fn``, the gates, the extend kernel) count as one launch each and their insides
are not counted: on the GPU they are Triton kernels, on the CPU stand-ins of many ops. An op is a launch unless
it is a view or an allocation without a fill (``OpOverload.is_view``, ``empty``). ``stacked`` is what the
records' startup does (:func:`~sglang_replayssm.radix.records.startup.prepare_layers`); without it every layer
keeps its own tensors (the pools the unit tests build by hand).
"""

from __future__ import annotations

import contextlib
import types
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sglang_replayssm.radix.records import capture as cap
from sglang_replayssm.radix.records import rebuild as rb
from sglang_replayssm.radix.records.interval_states import IntervalStates, kept_positions
from sglang_replayssm.radix.records.match import Rebuild
from sglang_replayssm.radix.records.pool import RecordPool, attach
from sglang_replayssm.radix.records.startup import prepare_layers
from sglang_replayssm.state import state_of
from tests.support.simulate import SimConfig, ToyModel, build_fixture
from tests.support.simulate_records import cpu_engine_backend

__all__ = ["OpCounter", "run_capture", "run_rebuild", "slope"]

_NO_LAUNCH = {"empty.memory_format", "empty_strided.default", "lift_fresh.default"}


class OpCounter(TorchDispatchMode):
    """Counts aten ops (``launches`` vs ``views``) while entered; a :meth:`kernel` call counts one launch."""

    def __init__(self) -> None:
        super().__init__()
        self.launches: Counter[str] = Counter()
        self.views: Counter[str] = Counter()
        self.paused = 0

    def __torch_dispatch__(self, func: Any, types_: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not self.paused:
            name = f"{func.overloadpacket.__name__}.{func._overloadname}"
            (self.views if func.is_view or name in _NO_LAUNCH else self.launches)[name] += 1
        return func(*args, **(kwargs or {}))

    def kernel(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` counted as one launch, whatever it runs inside."""
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if not self.paused:
                self.launches[f"KERNEL {name}"] += 1
            self.paused += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.paused -= 1
        return wrapped

    def total(self, what: str = "launches") -> int:
        return sum(getattr(self, what).values())


def _layer(model: ToyModel, layer_id: int, gen: torch.Generator) -> types.SimpleNamespace:
    D = model.qkv_dim
    return types.SimpleNamespace(
        layer_id=layer_id, conv_weights=0.4 * torch.randn(D, model.win + 1, generator=gen),
        bias=0.1 * torch.randn(D, generator=gen), activation="silu",
        A_log=torch.log(0.2 + 0.6 * torch.rand(model.HV, generator=gen)), dt_bias=0.1 * torch.randn(model.HV, generator=gen),
        q_dim=model.H * model.K, k_dim=model.H * model.K, v_dim=model.HV * model.V,
        num_q_heads=model.H, num_k_heads=model.H, num_v_heads=model.HV,
        head_q_dim=model.K, head_k_dim=model.K, head_v_dim=model.V)


@contextlib.contextmanager
def _setup(n_layers: int, counter: OpCounter, stacked: bool) -> Iterator[tuple[Any, ...]]:
    from sglang.srt.layers.attention.linear import gdn_backend

    cfg = SimConfig(kind="gdn", strategy="extra_buffer", mamba_layers=n_layers, head_dim=16, mamba_slots=24)
    model = ToyModel(cfg)
    _, _, req_pool = build_fixture(cfg, model)
    gen = torch.Generator().manual_seed(7)
    layers = [_layer(model, i, gen) for i in range(n_layers)]
    backend = cpu_engine_backend()
    backend._prefill_gates = counter.kernel("gates", backend._prefill_gates)
    backend.kernel_dispatcher.extend = counter.kernel("extend", backend.kernel_dispatcher.extend)
    backend.req_to_token_pool = req_pool
    pool = attach(req_pool, RecordPool(kv_size=1024, capacity=800, device=torch.device("cpu")))
    pool.states = IntervalStates(kv_size=1024, capacity=8, interval=256, device=torch.device("cpu"), rounded=True)
    if stacked:
        prepare_layers(pool, req_pool)
    conv = gdn_backend.causal_conv1d_fn
    gdn_backend.causal_conv1d_fn = counter.kernel("conv", conv)
    try:
        yield model, req_pool, layers, backend, pool, gen
    finally:
        gdn_backend.causal_conv1d_fn = conv


def run_rebuild(n_layers: int, *, stacked: bool = True, mixed: bool = False,
                depth: int = 700) -> tuple[OpCounter, dict[int, tuple[torch.Tensor, torch.Tensor]]]:
    """A hit at ``depth`` (off the 256 grid: the state at 512, its lead records, the records to ``depth``);
    ``mixed``: also a hit at 300 from a tree state at 290 and one at 40 from the root. Returns the counter
    and each layer's ``(temporal, conv)`` rows of the rebuilt slots."""
    counter = OpCounter()
    with _setup(n_layers, counter, stacked) as (model, req_pool, layers, backend, pool, gen):
        kv = torch.randperm(1000, generator=gen)[:depth]
        pool.assign(kv)
        pool.states.assign(kv[511:512])
        dest = pool.states.dest_of(kv[511:512])
        for layer in layers:
            pool.write(layer, backend, kv, torch.randn(depth, model.qkv_dim, generator=gen),
                       torch.randn(depth, model.HV, generator=gen), torch.randn(depth, model.HV, generator=gen))
            h = 0.1 * torch.randn(1, model.HV, model.V, model.K, generator=gen)
            pool.states.write_rows(layer.layer_id, dest, h, torch.tensor([0]), torch.float32)
        lead, alloc = pool.conv_lead, req_pool.mamba_allocator
        jobs = [Rebuild(dst=alloc.alloc(1), src=None, slots=pool.slots(kv[512 - lead:depth]),
                        state=int(pool.states.state_of[kv[511]]), lead=lead)]
        if mixed:
            src = alloc.alloc(1)
            for layer in layers:
                cache = req_pool.mamba2_layer_cache(layer.layer_id)
                cache.temporal[src] = 0.1 * torch.randn(cache.temporal[src].shape, generator=gen)
                cache.conv[0][src] = torch.randn(cache.conv[0][src].shape, generator=gen)
            jobs += [Rebuild(dst=alloc.alloc(1), src=src, slots=pool.slots(kv[290:300])),
                     Rebuild(dst=alloc.alloc(1), src=None, slots=pool.slots(kv[:40]))]
        with counter:
            rb.rebuild(pool, req_pool, jobs)
        dst = torch.cat([j.dst for j in jobs])
        out = {}
        for layer in layers:
            cache = req_pool.mamba2_layer_cache(layer.layer_id)
            out[layer.layer_id] = (cache.temporal[dst].clone(), cache.conv[0][dst].clone())
    return counter, out


def run_capture(n_layers: int, *, stacked: bool = True,
                tokens: int = 700) -> tuple[OpCounter, dict[int, tuple[torch.Tensor, ...]]]:
    """Two prefills of ``tokens`` from the root (the second counted): every GDN layer's capture and kept
    chunk states. Returns the counter and each layer's ``(x, a, b, kept states)`` rows of the tokens."""
    counter = OpCounter()
    wanted = cap._wanted
    cap._wanted = lambda *_: True  # the ring's presence is not what is counted
    try:
        with _setup(n_layers, counter, stacked) as (model, req_pool, layers, backend, pool, gen):
            mode = types.SimpleNamespace(is_decode=lambda: False)
            dispatcher = types.SimpleNamespace()
            ssm = torch.zeros(4, model.HV, model.V, model.K)
            nt = (tokens + 63) // 64
            for step in range(2):  # the first forward allocates the layers' records: count the second
                loc = torch.randperm(1000, generator=gen)[:tokens]
                pool.invalidate(loc)
                pool.assign(loc)
                kept, _ = kept_positions([0], [tokens], pool.states.interval, pool.states.chunk)
                pool.states.assign(loc[torch.tensor(kept)])
                inputs = [(torch.randn(tokens, model.qkv_dim, generator=gen), torch.randn(tokens, model.HV, generator=gen),
                           torch.randn(tokens, model.HV, generator=gen),
                           (None, None, torch.randn(1, nt, model.HV, model.V, model.K, generator=gen).bfloat16()))
                          for _ in layers]
                fb = types.SimpleNamespace(out_cache_loc=loc, forward_mode=mode, extend_prefix_lens_cpu=[0],
                                           extend_seq_lens_cpu=[tokens])
                with counter if step else contextlib.nullcontext():
                    for layer, (x, a, b, result) in zip(layers, inputs):
                        cap.capture(backend, layer, fb, x, a, b)
                        state_of(dispatcher).extending = (pool, layer, fb)
                        cap.keep_chunk_states(result, dispatcher, ssm)
                        state_of(dispatcher).extending = None
            slots = pool.slots(loc)
            rows = pool.states.dest_of(loc[torch.tensor(kept)])
            out: dict[int, tuple[torch.Tensor, ...]] = {lid: (rec.x[slots].clone(), rec.a[slots].clone(), rec.b[slots].clone(),
                         pool.states.ssm[lid][rows].clone()) for lid, rec in pool.layers.items()}
    finally:
        cap._wanted = wanted
    return counter, out


def slope(run: Callable[[int], tuple[OpCounter, Any]], lo: int = 2, hi: int = 4,
          what: str = "launches") -> tuple[float, float, OpCounter]:
    """``(per layer, per forward, the larger run's counter)``: the ops of ``run(lo)`` and ``run(hi)`` layers."""
    small, big = run(lo)[0], run(hi)[0]
    per_layer = (big.total(what) - small.total(what)) / (hi - lo)
    return per_layer, small.total(what) - per_layer * lo, big

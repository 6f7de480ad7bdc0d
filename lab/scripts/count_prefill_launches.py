"""Count the torch ops the records room issues per GDN layer of a prefill, on CPU (no GPU needed).

Two phases, each the product's own calls on SGLang's real CPU pools (``tests.support.simulate``):

* ``rebuild``: a prefix hit landing off the state grid (an interval state, its conv lead and the records
  up to the hit's depth) folded by :func:`sglang_replayssm.radix.records.rebuild.rebuild`;
* ``capture``: a plain prefill's capture, per GDN layer :func:`capture.capture` (the layer inputs into the
  record pool) and :func:`capture.keep_chunk_states` (the kept interval states; ``h`` in bf16, widened as
  in bf16 serving).

SGLang's kernels (``causal_conv1d_fn``, the gates, the extend and decode kernels) count as one launch each
and their insides are not counted: on the GPU they are Triton kernels, on the CPU stand-ins of many ops.
An op is a launch unless it is a view / metadata op (``OpOverload.is_view``, ``empty``). Each phase runs
with two layer counts; ``per layer`` is the slope, ``per forward`` the intercept.

    PYTHONPATH=$PWD /work/main/.venv/bin/python lab/scripts/count_prefill_launches.py [--ops]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import types
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the product, tests.support
os.environ.setdefault("TRITON_INTERPRET", "1")  # SGLang's Triton conv on the CPU, as the tests run it

from sglang_replayssm.radix.records import capture as cap  # noqa: E402
from sglang_replayssm.radix.records import rebuild as rb  # noqa: E402
from sglang_replayssm.radix.records.interval_states import IntervalStates, kept_positions  # noqa: E402
from sglang_replayssm.radix.records.match import Rebuild  # noqa: E402
from sglang_replayssm.radix.records.pool import RecordPool, attach  # noqa: E402
from sglang_replayssm.state import state_of  # noqa: E402
from tests.support.simulate import SimConfig, ToyModel, build_fixture  # noqa: E402
from tests.support.simulate_records import cpu_engine_backend  # noqa: E402

_NO_LAUNCH = {"empty.memory_format", "empty_strided.default", "lift_fresh.default"}


class OpCounter(TorchDispatchMode):
    """Counts aten ops (launches vs views) while ``active``; a kernel call counts one launch."""

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
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if not self.paused:
                self.launches[f"KERNEL {name}"] += 1
            self.paused += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.paused -= 1
        return wrapped


def _layer(model: ToyModel, layer_id: int, gen: torch.Generator) -> types.SimpleNamespace:
    D = model.qkv_dim
    return types.SimpleNamespace(
        layer_id=layer_id, conv_weights=0.4 * torch.randn(D, model.win + 1, generator=gen),
        bias=0.1 * torch.randn(D, generator=gen), activation="silu",
        A_log=torch.log(0.2 + 0.6 * torch.rand(model.HV, generator=gen)), dt_bias=0.1 * torch.randn(model.HV, generator=gen),
        q_dim=model.H * model.K, k_dim=model.H * model.K, v_dim=model.HV * model.V,
        num_q_heads=model.H, num_k_heads=model.H, num_v_heads=model.HV,
        head_q_dim=model.K, head_k_dim=model.K, head_v_dim=model.V)


def _prepare(pool: RecordPool, req_pool: Any) -> None:
    """What the records' startup does for a pool before its first forward (when it has such a step)."""
    prepare = getattr(sys.modules["sglang_replayssm.radix.records.startup"], "prepare_layers", None)
    if prepare is not None:
        prepare(pool, req_pool)


@contextlib.contextmanager
def _setup(n_layers: int, counter: OpCounter) -> Iterator[tuple[Any, ...]]:
    import sglang_replayssm.radix.records.startup  # noqa: F401
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
    conv = gdn_backend.causal_conv1d_fn
    gdn_backend.causal_conv1d_fn = counter.kernel("conv", conv)
    try:
        yield model, req_pool, layers, backend, pool
    finally:
        gdn_backend.causal_conv1d_fn = conv


def count_rebuild(n_layers: int, depth: int = 700) -> OpCounter:
    """A hit at ``depth`` (off the 256 grid): the state at 512, its 3 lead records, the records to ``depth``."""
    counter = OpCounter()
    with _setup(n_layers, counter) as (model, req_pool, layers, backend, pool):
        _prepare(pool, req_pool)
        kv = torch.randperm(1000, generator=torch.Generator().manual_seed(1))[:depth]
        pool.assign(kv)
        pool.states.assign(kv[511:512])
        dest = pool.states.dest_of(kv[511:512])
        for layer in layers:
            pool.write(layer, backend, kv, torch.randn(depth, model.qkv_dim), torch.randn(depth, model.HV),
                       torch.randn(depth, model.HV))
            h = torch.randn(1, model.HV, model.V, model.K)
            pool.states.write_rows(layer.layer_id, dest, h, torch.tensor([0]), torch.float32)
        lead = pool.conv_lead
        slot = int(pool.states.state_of[kv[511]])
        job = Rebuild(dst=req_pool.mamba_allocator.alloc(1), src=None, slots=pool.slots(kv[512 - lead:depth]),
                      state=slot, lead=lead)
        with counter:
            rb.rebuild(pool, req_pool, [job])
    return counter


def count_capture(n_layers: int, tokens: int = 700) -> OpCounter:
    """One prefill of ``tokens`` from the root: every GDN layer's capture and kept chunk states."""
    counter = OpCounter()
    orig_wanted = cap._wanted
    cap._wanted = lambda *_: True  # type: ignore[assignment]  # the ring's presence is not what is counted
    try:
        with _setup(n_layers, counter) as (model, req_pool, layers, backend, pool):
            _prepare(pool, req_pool)
            loc = torch.randperm(1000, generator=torch.Generator().manual_seed(2))[:tokens]
            pool.assign(loc)
            kept, _ = kept_positions([0], [tokens], pool.states.interval, pool.states.chunk)
            pool.states.assign(loc[torch.tensor(kept)])
            mode = types.SimpleNamespace(is_decode=lambda: False)
            dispatcher = types.SimpleNamespace()
            ssm = torch.zeros(4, model.HV, model.V, model.K)
            nt = (tokens + 63) // 64
            inputs = [(torch.randn(tokens, model.qkv_dim), torch.randn(tokens, model.HV), torch.randn(tokens, model.HV),
                       (None, None, torch.randn(1, nt, model.HV, model.V, model.K).to(torch.bfloat16)))
                      for _ in layers]
            for step in range(2):  # the first forward allocates the layers' records: count the second
                fb = types.SimpleNamespace(out_cache_loc=loc, forward_mode=mode, extend_prefix_lens_cpu=[0],
                                           extend_seq_lens_cpu=[tokens])
                with counter if step else contextlib.nullcontext():
                    for layer, (x, a, b, result) in zip(layers, inputs):
                        cap.capture(backend, layer, fb, x, a, b)
                        state_of(dispatcher).extending = (pool, layer, fb)
                        cap.keep_chunk_states(result, dispatcher, ssm)
                        state_of(dispatcher).extending = None
    finally:
        cap._wanted = orig_wanted  # type: ignore[assignment]
    return counter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, nargs=2, default=(2, 6), help="the two layer counts (slope)")
    parser.add_argument("--ops", action="store_true", help="list the ops of the larger run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lo, hi = args.layers
    for phase, fn in (("rebuild", count_rebuild), ("capture", count_capture)):
        small, big = fn(lo), fn(hi)
        for what in ("launches", "views"):
            a, b = sum(getattr(small, what).values()), sum(getattr(big, what).values())
            per_layer = (b - a) / (hi - lo)
            print(f"{phase:8s} {what:8s}: {per_layer:5.1f} per layer + {a - per_layer * lo:5.1f} per forward "
                  f"({lo} layers: {a}, {hi} layers: {b})")
        if args.ops:
            for what in ("launches", "views"):
                print(f"  {what} ({hi} layers):", dict(sorted(getattr(big, what).items())))


if __name__ == "__main__":
    main()

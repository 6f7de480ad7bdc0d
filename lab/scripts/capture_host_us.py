"""Host microseconds a GDN layer's record capture costs in a forward, on CPU tensors (lab only).

    PYTHONPATH=. python lab/scripts/capture_host_us.py [--layers 18] [--tokens 32] [--device cuda] [--width 8192]
        [--graph] [--kept]

A record pool with the layers stacked as a server builds it (``startup.prepare_layers``), then per forward what a
prefill runs per GDN layer: ``capture`` (x written, a / b staged, the stack written at the last layer),
``extending`` and ``keep_chunk_states`` (no kept state at this length; ``--kept``: the chunk states at the
interval, from an ``h`` of every chunk). ``--graph``: as inside a prefill CUDA graph (SGLang's CUDA default: every
layer's inputs written in its own break, nothing held). Prints the median forward, the same
forward's inputs alone, and their difference per layer. On CUDA the host time of the forward's launches (the
device drained after each forward, outside the time).
"""

from __future__ import annotations

import argparse
import statistics
import time
import types

import torch

from sglang_replayssm.radix.records import capture as cap
from sglang_replayssm.radix.records import startup
from sglang_replayssm.radix.records.interval_states import IntervalStates
from sglang_replayssm.radix.records.pool import RecordPool, attach


class _Extend:
    def is_target_verify(self) -> bool:
        return False

    def is_draft_extend_v2(self) -> bool:
        return False

    def is_decode(self) -> bool:
        return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=18)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--device", default="cpu")
    p.add_argument("--width", type=int, default=64, help="x's row (conv_dim; Qwen3-Next's: 8192)")
    p.add_argument("--graph", action="store_true", help="as inside a prefill CUDA graph's execution")
    p.add_argument("--kept", action="store_true", help="keep the interval's chunk states (states 32 x 128 x 128)")
    args = p.parse_args()
    torch.set_num_threads(1)
    n, T, dev = args.layers, args.tokens, torch.device(args.device)
    mamba_pool = types.SimpleNamespace(enable_linear_replayssm=True, replayssm_write_pos=torch.zeros(4),
                                       mamba_cache=types.SimpleNamespace(replayssm_d=0, replayssm_k=0, replayssm_g=0))
    req_pool = types.SimpleNamespace(mamba_pool=mamba_pool, mamba_map={i: i for i in range(n)})
    pool = attach(req_pool, RecordPool(kv_size=4096, capacity=2048, device=dev))
    if args.kept:
        pool.states = IntervalStates(kv_size=4096, capacity=64, interval=256, device=dev, rounded=True)
    if args.graph:
        cap._prefill_graph = lambda: True  # type: ignore[assignment]
    startup.prepare_layers(pool, req_pool)
    backend = type("GDNAttnBackend", (), {})()
    backend.req_to_token_pool, backend.kernel_dispatcher = req_pool, types.SimpleNamespace()
    layers = [types.SimpleNamespace(layer_id=i, conv_weights=torch.zeros(8, 4)) for i in range(n)]
    x, a, b = (torch.randn(T, w, device=dev) for w in (args.width, 4, 4))
    shape = (32, 128, 128) if args.kept else (4, 4, 4)
    states = torch.zeros(2, *shape, device=dev)
    chunks = -(-T // 64)
    h = torch.randn(1, chunks, *shape, device=dev, dtype=torch.bfloat16 if args.kept else torch.float32)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def forward(with_capture: bool) -> None:
        loc = torch.arange(1, T + 1, device=dev)
        fb = types.SimpleNamespace(out_cache_loc=loc, forward_mode=_Extend(), spec_info=None,
                                   extend_prefix_lens_cpu=[0], extend_seq_lens_cpu=[T])
        pool.assign(loc)
        if args.kept:
            cap._assign_states(pool, loc, [0], [T])
        for layer in layers:
            ra, rb = a.clone(), b.clone()  # a forward's own a, b (each layer's, owning its storage)
            if with_capture:
                plan = cap.capture(backend, layer, fb, x, ra, rb)
                with cap.extending(backend, layer, fb, plan):
                    cap.keep_chunk_states((None, None, h), backend.kernel_dispatcher, states, h_at=2)

    med = {}
    for with_capture in (True, False):
        for _ in range(20):
            forward(with_capture)
        sync()
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            forward(with_capture)
            times.append(time.perf_counter() - t0)
            sync()
        med[with_capture] = statistics.median(times) * 1e6
    print(f"{n} layers, {T} tokens, x [{T}, {args.width}] on {dev}: forward {med[True]:.0f} us, inputs alone "
          f"{med[False]:.0f} us, capture {(med[True] - med[False]) / n:.1f} us a layer")


if __name__ == "__main__":
    main()

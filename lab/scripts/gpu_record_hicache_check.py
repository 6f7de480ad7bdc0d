"""CUDA check of record_hicache's transfer mechanics with SGLang stubbed (the device box has no SGLang; run
`python3 lab/scripts/gpu_record_hicache_check.py` from the repo root there, not under pytest):
side-stream D2H fenced behind a busy 'forward' stream, event polling, pinned staging, queued H2D writes."""
import sys
import time
import types
from pathlib import Path

import torch

for name in ["sglang", "sglang.srt", "sglang.srt.mem_cache", "sglang.srt.mem_cache.pool_host"]:
    sys.modules.setdefault(name, types.ModuleType(name))
base = types.ModuleType("sglang.srt.mem_cache.pool_host.base")


class HostKVCache:
    def alloc(self, n):
        return None


base.HostKVCache = HostKVCache
sys.modules["sglang.srt.mem_cache.pool_host.base"] = base
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the product, tests.support, lab
from sglang_replayssm.radix.records.hicache import host_records as RH  # noqa: E402
from sglang_replayssm.radix.records.pool import RecordPool, attach  # noqa: E402
from sglang_replayssm.state import ReplaySSMState  # noqa: E402

dev = torch.device("cuda")
pool = RecordPool(kv_size=4096, capacity=1024, device=dev)


class Layer:
    def __init__(self, i):
        self.layer_id = i


class GDNAttnBackend:
    pass


layers = [Layer(i) for i in range(3)]
kv = torch.arange(100, 600, device=dev)
pool.assign(kv)
xs = {}
forward = torch.cuda.Stream()
with torch.cuda.stream(forward):
    torch.cuda._sleep(200_000_000)  # the 'forward' is busy ~0.1 s before it writes the rows
    for layer in layers:
        x, a, b = (torch.randn(500, 64, device=dev), torch.randn(500, 8, device=dev), torch.randn(500, 8, device=dev))
        pool.write(layer, GDNAttnBackend(), kv, x, a, b)
        xs[layer.layer_id] = (x, a, b)


class HostPool(HostKVCache):
    logical_size = 8192


controller = types.SimpleNamespace(mem_pool_device_allocator=types.SimpleNamespace(_replayssm_state=ReplaySSMState(record_pool=pool)),
                                   mem_pool_host=HostPool(), write_fence_stream=forward)
torch.cuda.current_stream().wait_stream(forward)  # the record pool's layers exist (scheduler saw the forward)
host_kv = torch.arange(1000, 1500)
t0 = time.perf_counter()
RH.backed_up(controller, kv, host_kv)
t_call = time.perf_counter() - t0
host = pool.hicache.host
assert host is not None and host.pin
host.poll()
in_flight_right_after = host.done == 0
torch.cuda.synchronize()
host.poll()
assert host.done == 1, host.done
for i, (x, a, b) in xs.items():
    hx, ha, hb = host.layers[i]
    rows = host.slot_of[host_kv]
    assert torch.equal(hx[rows], x.cpu()) and torch.equal(ha[rows], a.cpu()) and torch.equal(hb[rows], b.cpu())
assert bool(host.valid[host.slot_of[host_kv]].all())
# The device rows get overwritten (FIFO reuse by later forwards); the KV indices are freed.
for rec in pool.layers.values():
    for t in (rec.x, rec.a, rec.b):
        t.zero_()
pool.invalidate(kv)
new_kv = torch.arange(2000, 2500, device=dev)
pool.invalidate(new_kv)
RH.loaded_back(controller, host_kv, new_kv)
assert pool.covered(new_kv) and len(pool.hicache.loads) == 1
runner = types.SimpleNamespace(req_to_token_pool=types.SimpleNamespace(), is_draft_worker=False)
attach(runner.req_to_token_pool, pool)
RH.run_pending(runner)
torch.cuda.synchronize()
slots = pool.slots(new_kv)
for i, (x, a, b) in xs.items():
    rec = pool.layers[i]
    assert torch.equal(rec.x[slots], x) and torch.equal(rec.a[slots], a) and torch.equal(rec.b[slots], b)
print(f"OK: backed_up returned in {t_call * 1e3:.2f} ms while the fenced forward was busy "
      f"(copy in flight right after: {in_flight_right_after}); host rows == device rows; loaded back exactly")

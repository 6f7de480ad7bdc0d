"""HiCache on the CPU runtime: the torch transfer ops, SGLang's host pools using them, and real servers.

* Op tests (fast): every op in cpu/hicache_ops.py against a plain index-copy reference written from the
  layout's shape (`host[page, layer, offset] = dev[layer][idx]` and so on), several dtypes and page sizes.
* Pool tests (fast): SGLang's own hybrid cache (its unit-test kit's fixture) with HiCache on CPU; the
  host pools it builds back device rows up and load them back through the injected ops, for every
  layout / io backend pair the pools offer.
Real servers: tests/test_cpu_hicache_server.py.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from unittest import mock

import pytest
import torch

from sglang_replayssm.cpu import hicache_ops as ops
from sglang_replayssm.cpu import hooks_hicache

DTYPES = [torch.float32, torch.bfloat16]


def _rand(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(dtype)


def _perm(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randperm(n, generator=gen)[:k]


def _ptrs(layers: list[torch.Tensor]) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in layers], dtype=torch.uint64)


def _nbytes_row(t: torch.Tensor) -> int:
    return t[0].numel() * t.element_size()


# ----------------------------------------------------------------------------- ops vs index-copy reference

L, H, D, N_DEV, N_HOST = 3, 2, 8, 12, 20


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_layer_lf_and_all_layer_tables(dtype):
    g = torch.Generator().manual_seed(0)
    dev_k = [_rand((N_DEV, H, D), dtype, g) for _ in range(L)]
    dev_v = [_rand((N_DEV, H, D), dtype, g) for _ in range(L)]
    host = torch.zeros((2, L, N_HOST, H, D), dtype=dtype)  # layer_first host layout
    src, dst = _perm(N_DEV, 5, g), _perm(N_HOST, 5, g)
    item = H * D * dtype.itemsize
    ops.transfer_kv_all_layer(src_k_layers=_ptrs(dev_k), dst_k_layers=_ptrs(list(host[0])),
                              src_v_layers=_ptrs(dev_v), dst_v_layers=_ptrs(list(host[1])),
                              src_indices=src, dst_indices=dst, item_size=item, num_layers=L)
    want = torch.zeros_like(host)
    for layer in range(L):
        want[0, layer, dst] = dev_k[layer][src]
        want[1, layer, dst] = dev_v[layer][src]
    assert torch.equal(host, want)
    # And back, one layer at a time, into cleared device layers.
    out_k, out_v = torch.zeros_like(dev_k[1]), torch.zeros_like(dev_v[1])
    ops.transfer_kv_per_layer(src_k=host[0, 1], dst_k=out_k, src_v=host[1, 1], dst_v=out_v,
                              src_indices=dst, dst_indices=src, item_size=item)
    assert torch.equal(out_k[src], dev_k[1][src]) and torch.equal(out_v[src], dev_v[1][src])
    untouched = torch.ones(N_DEV, dtype=torch.bool)
    untouched[src] = False
    assert not out_k[untouched].any() and not out_v[untouched].any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_page_first_kernel_ops(dtype):
    g = torch.Generator().manual_seed(1)
    dev_k = [_rand((N_DEV, H, D), dtype, g) for _ in range(L)]
    dev_v = [_rand((N_DEV, H, D), dtype, g) for _ in range(L)]
    host = torch.zeros((2, N_HOST, L, H, D), dtype=dtype)  # page_first: [kv, token, layer, head, dim]
    item = H * D * dtype.itemsize
    src, dst = _perm(N_DEV, 7, g), _perm(N_HOST, 7, g)
    ops.transfer_kv_all_layer_lf_pf(src_k_layers=_ptrs(dev_k), dst_k=host[0], src_v_layers=_ptrs(dev_v),
                                    dst_v=host[1], src_indices=src, dst_indices=dst, item_size=item,
                                    dst_layout_dim=item * L, num_layers=L)
    want = torch.zeros_like(host)
    for layer in range(L):
        want[0, dst, layer] = dev_k[layer][src]
        want[1, dst, layer] = dev_v[layer][src]
    assert torch.equal(host, want)
    for layer in range(L):
        out_k, out_v = torch.zeros_like(dev_k[0]), torch.zeros_like(dev_v[0])
        ops.transfer_kv_per_layer_pf_lf(src_k=host[0], dst_k=out_k, src_v=host[1], dst_v=out_v,
                                        src_indices=dst, dst_indices=src, layer_id=layer, item_size=item,
                                        src_layout_dim=item * L)
        assert torch.equal(out_k[src], dev_k[layer][src]) and torch.equal(out_v[src], dev_v[layer][src])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 4])
def test_page_head_kernel_ops(dtype, page_size):
    g = torch.Generator().manual_seed(2)
    pages = 6
    dev_k = [_rand((N_DEV, H, D), dtype, g) for _ in range(L)]
    dev_v = [_rand((N_DEV, H, D), dtype, g) for _ in range(L)]
    host = torch.zeros((2, pages, H, page_size, L, D), dtype=dtype)  # page_head layout
    item = H * D * dtype.itemsize
    src, dst = _perm(N_DEV, 5, g), _perm(pages * page_size, 5, g)
    ops.transfer_kv_all_layer_lf_ph(src_k_layers=_ptrs(dev_k), dst_k=host[0], src_v_layers=_ptrs(dev_v),
                                    dst_v=host[1], src_indices=src, dst_indices=dst, item_size=item,
                                    dst_layout_dim=item * L, num_layers=L, page_size=page_size, head_num=H)
    want = torch.zeros_like(host)
    for layer in range(L):
        for kv, dev in ((0, dev_k), (1, dev_v)):
            # [token, head, dim] -> host[kv, page, head, offset, layer, dim]
            want[kv, dst // page_size, :, dst % page_size, layer] = dev[layer][src]
    assert torch.equal(host, want)
    for layer in range(L):
        out_k, out_v = torch.zeros_like(dev_k[0]), torch.zeros_like(dev_v[0])
        ops.transfer_kv_per_layer_ph_lf(src_k=host[0], dst_k=out_k, src_v=host[1], dst_v=out_v,
                                        src_indices=dst, dst_indices=src, layer_id=layer, item_size=item,
                                        src_layout_dim=item * L, page_size=page_size, head_num=H)
        assert torch.equal(out_k[src], dev_k[layer][src]) and torch.equal(out_v[src], dev_v[layer][src])


@pytest.mark.parametrize("dtype", DTYPES)
def test_mla_ops(dtype):
    g = torch.Generator().manual_seed(3)
    width = 24  # kv_lora_rank + rope dim, one latent row per token
    dev = [_rand((N_DEV, 1, width), dtype, g) for _ in range(L)]
    item = width * dtype.itemsize
    src, dst = _perm(N_DEV, 6, g), _perm(N_HOST, 6, g)
    host_lf = torch.zeros((L, N_HOST, 1, width), dtype=dtype)
    ops.transfer_kv_all_layer_mla(src_layers=_ptrs(dev), dst_layers=_ptrs(list(host_lf)), src_indices=src,
                                  dst_indices=dst, item_size=item, num_layers=L)
    host_pf = torch.zeros((N_HOST, L, 1, width), dtype=dtype)
    ops.transfer_kv_all_layer_mla_lf_pf(src_layers=_ptrs(dev), dst=host_pf, src_indices=src, dst_indices=dst,
                                        item_size=item, dst_layout_dim=item * L, num_layers=L)
    for layer in range(L):
        assert torch.equal(host_lf[layer, dst], dev[layer][src])
        assert torch.equal(host_pf[dst, layer], dev[layer][src])
        out_lf, out_pf = torch.zeros_like(dev[0]), torch.zeros_like(dev[0])
        ops.transfer_kv_per_layer_mla(src=host_lf[layer], dst=out_lf, src_indices=dst, dst_indices=src,
                                      item_size=item)
        ops.transfer_kv_per_layer_mla_pf_lf(src=host_pf, dst=out_pf, src_indices=dst, dst_indices=src,
                                            layer_id=layer, item_size=item, src_layout_dim=item * L)
        assert torch.equal(out_lf[src], dev[layer][src]) and torch.equal(out_pf[src], dev[layer][src])


@pytest.mark.parametrize("dtype", DTYPES)
def test_mamba_kernel_ops(dtype):
    """MambaPoolHost's page_first layout: [slot, layer, 1, *state_shape] vs device [layer][slot, *shape]."""
    g = torch.Generator().manual_seed(4)
    shape = (2, 5, 3)  # e.g. (heads, k, v) for temporal, or a conv window
    device = _rand((L, N_DEV, *shape), dtype, g)
    host = torch.zeros((N_HOST, L, 1, *shape), dtype=dtype)
    item = _nbytes_row(device[0])
    src, dst = _perm(N_DEV, 4, g), _perm(N_HOST, 4, g)
    ops.transfer_kv_mamba_lf_pf(src_ptrs=_ptrs(list(device.unbind(0))), dst=host, src_indices=src,
                                dst_indices=dst, item_size=item, dst_layout_dim=item * L, num_layers=L)
    for layer in range(L):
        assert torch.equal(host[dst, layer, 0], device[layer, src])
    back = torch.zeros_like(device)
    for layer in range(L):
        ops.transfer_kv_mamba_pf_lf(src=host, dst=back[layer], src_indices=dst, dst_indices=src, layer_id=layer,
                                    item_size=item, src_layout_dim=item * L)
    assert torch.equal(back[:, src], device[:, src])
    others = torch.ones(N_DEV, dtype=torch.bool)
    others[src] = False
    assert not back[:, others].any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 4])
def test_direct_ops(dtype, page_size):
    """transfer_kv_direct (layer_first) and the page_first_direct pair ([page, layer, offset, ...])."""
    g = torch.Generator().manual_seed(5)
    pages = 5
    dev_k = [_rand((N_DEV, H, D), dtype, g) for _ in range(L)]
    dev_v = [_rand((N_DEV, H, D), dtype, g) for _ in range(L)]
    # Whole pages, as SGLang hands the direct backend (page-aligned runs).
    src = (_perm(N_DEV // page_size, 2, g)[:, None] * page_size + torch.arange(page_size)).reshape(-1)
    dst = (_perm(pages, 2, g)[:, None] * page_size + torch.arange(page_size)).reshape(-1)

    lf = torch.zeros((2, L, pages * page_size, H, D), dtype=dtype)
    ops.transfer_kv_direct(src_layers=[*dev_k, *dev_v], dst_layers=[*lf[0], *lf[1]], src_indices=src,
                           dst_indices=dst, page_size=page_size)
    for layer in range(L):
        assert torch.equal(lf[0, layer, dst], dev_k[layer][src]) and torch.equal(lf[1, layer, dst], dev_v[layer][src])

    pfd = torch.zeros((2, pages, L, page_size, H, D), dtype=dtype)
    ops.transfer_kv_all_layer_direct_lf_pf(src_ptrs=[*dev_k, *dev_v], dst_ptrs=[pfd[0], pfd[1]], src_indices=src,
                                           dst_indices=dst, page_size=page_size)
    want = torch.zeros_like(pfd)
    for layer in range(L):
        want[0, dst // page_size, layer, dst % page_size] = dev_k[layer][src]
        want[1, dst // page_size, layer, dst % page_size] = dev_v[layer][src]
    assert torch.equal(pfd, want)
    for layer in range(L):
        out_k, out_v = torch.zeros_like(dev_k[0]), torch.zeros_like(dev_v[0])
        ops.transfer_kv_per_layer_direct_pf_lf(src_ptrs=[pfd[0], pfd[1]], dst_ptrs=[out_k, out_v], src_indices=dst,
                                               dst_indices=src, layer_id=layer, page_size=page_size)
        assert torch.equal(out_k[src], dev_k[layer][src]) and torch.equal(out_v[src], dev_v[layer][src])


def test_direct_ops_single_buffer_and_strided_views():
    """The one-buffer form (MLA latent / mamba state, page_size 1) and device views with padded slots."""
    g = torch.Generator().manual_seed(6)
    padded = _rand((L, N_DEV, 4, 7), torch.float32, g)
    device = [padded[layer, :, :, :5] for layer in range(L)]  # slot stride 28 elements, 20 used
    host = torch.zeros((N_HOST, L, 1, 4, 5))
    src, dst = _perm(N_DEV, 4, g), _perm(N_HOST, 4, g)
    ops.transfer_kv_all_layer_direct_lf_pf(src_ptrs=device, dst_ptrs=[host], src_indices=src, dst_indices=dst,
                                           page_size=1)
    for layer in range(L):
        assert torch.equal(host[dst, layer, 0], device[layer][src])
    back = torch.zeros_like(padded)
    views = [back[layer, :, :, :5] for layer in range(L)]
    ops.transfer_kv_per_layer_direct_pf_lf(src_ptrs=[host], dst_ptrs=[views[2]], src_indices=dst, dst_indices=src,
                                           layer_id=2, page_size=1)
    assert torch.equal(views[2][src], device[2][src])
    assert not back[2, :, :, 5:].any() and not back[:2].any()


def test_indices_any_int_dtype_and_empty():
    g = torch.Generator().manual_seed(7)
    src_t = _rand((N_DEV, 16), torch.float32, g)
    dst_t = torch.zeros((N_HOST, 16))
    for dt in (torch.int32, torch.int64):
        ops.transfer_kv_per_layer_mla(src=src_t, dst=dst_t, src_indices=torch.tensor([2, 5], dtype=dt),
                                      dst_indices=torch.tensor([9, 0], dtype=dt), item_size=64)
        assert torch.equal(dst_t[[9, 0]], src_t[[2, 5]])
    before = dst_t.clone()
    empty = torch.empty(0, dtype=torch.int64)
    ops.transfer_kv_per_layer_mla(src=src_t, dst=dst_t, src_indices=empty, dst_indices=empty, item_size=64)
    ops.transfer_kv_mamba_lf_pf(src_ptrs=_ptrs([src_t]), dst=dst_t, src_indices=empty, dst_indices=empty,
                                item_size=64, dst_layout_dim=64, num_layers=1)
    assert torch.equal(dst_t, before)


def test_bad_calls_raise_instead_of_corrupting():
    src_t, dst_t = torch.randn(4, 16), torch.zeros(4, 16)
    with pytest.raises(ValueError, match="source indices"):
        ops.transfer_kv_per_layer_mla(src=src_t, dst=dst_t, src_indices=torch.tensor([0, 1]),
                                      dst_indices=torch.tensor([0]), item_size=64)
    # An index past a tensor operand's storage is caught by the storage bounds, not written.
    with pytest.raises(RuntimeError):
        ops.transfer_kv_per_layer_mla(src=src_t, dst=dst_t, src_indices=torch.tensor([1]),
                                      dst_indices=torch.tensor([4]), item_size=64)
    assert not dst_t.any()
    # Rows that are not item_size apart (a padded slot axis) are a caller bug the kernels cannot see.
    padded = torch.zeros(4, 32)[:, :16]
    with pytest.raises(ValueError, match="bytes apart"):
        ops.transfer_kv_per_layer_mla(src=src_t, dst=padded, src_indices=torch.tensor([0]),
                                      dst_indices=torch.tensor([0]), item_size=64)
    with pytest.raises(ValueError, match="layer addresses"):
        ops.transfer_kv_all_layer_mla(src_layers=src_t, dst_layers=_ptrs([dst_t]), src_indices=torch.tensor([0]),
                                      dst_indices=torch.tensor([0]), item_size=64, num_layers=1)


# ----------------------------------------------------------------------------- binding into SGLang's modules


def test_every_transfer_op_sglang_references_is_bound():
    """Guards SGLang drift: each pool module's `transfer_kv_*` names resolve after inject_ops."""
    import importlib

    hooks_hicache.inject_ops()
    for module_name in hooks_hicache.MODULE_OPS:
        module = importlib.import_module(module_name)
        source = Path(module.__file__).read_text()
        used = set(re.findall(r"\btransfer_kv_\w+", source)) - {"transfer_kv_dim_exchange"}  # NPU-only
        missing = sorted(n for n in used if getattr(module, n, None) is None)
        assert not missing, f"{module_name}: {missing}"
        for name in hooks_hicache.MODULE_OPS[module_name]:
            assert getattr(module, name) is ops.ALL_OPS[name], (module_name, name)


def test_inject_never_overrides_a_bound_op(monkeypatch):
    from sglang.srt.mem_cache.pool_host import mha

    sentinel = object()
    monkeypatch.setattr(mha, "transfer_kv_per_layer", sentinel)
    hooks_hicache.inject_ops()
    assert mha.transfer_kv_per_layer is sentinel


def test_cpu_stream_gets_synchronize():
    hooks_hicache.patch_cpu_stream()
    stream = torch.cpu.Stream()
    assert stream.synchronize() is None and stream.query() is True


@pytest.mark.parametrize(("pool", "layout", "io", "ok"), [
    ("MHATokenToKVPoolHost", "page_first", "kernel", True),
    ("MHATokenToKVPoolHost", "layer_first", "direct", True),
    ("MHATokenToKVPoolHost", "page_head", "kernel", True),
    ("MHATokenToKVPoolHost", "page_first_direct", "direct", True),
    ("MHATokenToKVPoolHost", "page_first_kv_split", "kernel", False),
    ("MHATokenToKVPoolHost", "page_unified", "kernel", False),
    ("MHATokenToKVPoolHost", "page_first", "kernel_ascend", False),
    ("MLATokenToKVPoolHost", "page_first", "kernel", True),
    ("MLATokenToKVPoolHost", "page_head", "kernel", False),
    ("MambaPoolHost", "page_first", "kernel", True),
    ("MambaPoolHost", "page_first_direct", "direct", True),
    ("MambaPoolHost", "layer_first", "kernel", False),
    ("MambaPoolHost", "page_head", "kernel", False),
])
def test_unsupported_reason(pool, layout, io, ok):
    reason = hooks_hicache.unsupported_reason(pool, layout, io)
    assert (reason is None) == ok, reason
    if not ok:
        assert "\n" not in reason and "--hicache-" in reason
        assert (layout in reason) or (io in reason)


def test_flag_check_refuses_before_the_pool_allocates():
    """The AROUND hook on MambaPoolHost.__init__ raises the one-line reason; the constructor never runs."""
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", hicache_io_backend="kernel"))
    original = mock.Mock(side_effect=AssertionError("constructor ran"))
    original.__signature__ = inspect.signature(MambaPoolHost.__init__)
    this = object.__new__(MambaPoolHost)
    with pytest.raises(ValueError, match=r"--hicache-mem-layout layer_first .*MambaPoolHost"):
        hooks_hicache._check_flags_around(original, this, None, 2.0, 0, device_capacity=8, layout="layer_first")
    original.assert_not_called()


# ----------------------------------------------------------------------------- SGLang's host pools on CPU


@pytest.fixture
def hicache_fixture(monkeypatch):
    """`build(layout, io, page_size, mamba)` -> SGLang's UnifiedRadixCache with HiCache, CPU tensors."""
    from sglang.srt.mem_cache.pool_host import common
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
    from sglang.test.kits.unified_radix_cache import fixtures
    from sglang.test.kits.unified_radix_cache.config import CacheConfig

    # What cpu/hooks.py does in a server: no cudaHostRegister without a driver.
    monkeypatch.setattr(common, "_cuda_host_register", lambda *a, **k: None)
    hooks_hicache.inject_ops()
    caches = []

    def build(layout: str, io: str, page_size: int, mamba: bool):
        comps = (ComponentType.FULL, ComponentType.MAMBA) if mamba else (ComponentType.FULL,)
        cfg = CacheConfig(page_size=page_size, components=comps, num_layers=4, full_attention_layer_ids=(1, 3),
                          mamba_cache_size=8, kv_size=64, max_num_reqs=4, max_context_len=64, head_num=2,
                          head_dim=8, dtype=torch.float32)
        with mock.patch.object(fixtures, "get_device", lambda: "cpu"):
            cache, _, _ = fixtures.build_fixture(cfg)
        args = ServerArgs(model_path="dummy", page_size=page_size, hicache_io_backend=io,
                          hicache_mem_layout=layout, hicache_ratio=2.0)
        args._mamba_cache_chunk_size = 64
        set_global_server_args_for_scheduler(args)
        cache.init_hicache(args, cache.cache_init_params)
        caches.append(cache)
        return cache

    yield build
    for cache in caches:
        cache.release_host_resources()


POOL_CASES = [
    # (layout, io backend, page size, with mamba)
    ("page_first", "kernel", 1, True),
    ("page_first_direct", "direct", 1, True),
    ("layer_first", "kernel", 1, False),
    ("layer_first", "direct", 4, False),
    ("page_first", "kernel", 4, False),
    ("page_first_direct", "direct", 4, False),
    ("page_head", "kernel", 4, False),
]


@pytest.mark.parametrize(("layout", "io", "page_size", "mamba"), POOL_CASES,
                         ids=[f"{lay}-{io}-ps{ps}{'-mamba' if m else ''}" for lay, io, ps, m in POOL_CASES])
def test_sglang_host_pools_round_trip(hicache_fixture, layout, io, page_size, mamba):
    """Backup (all layers) then per-layer load-back through SGLang's own pool methods restores the rows."""
    cache = hicache_fixture(layout, io, page_size, mamba)
    entries = cache.cache_controller.mem_pool_host.entries
    kinds = {type(e.host_pool).__name__ for e in entries}
    assert kinds == ({"MHATokenToKVPoolHost", "MambaPoolHost"} if mamba else {"MHATokenToKVPoolHost"})
    g = torch.Generator().manual_seed(8)
    for entry in entries:
        host, device = entry.host_pool, entry.device_pool
        assert host.layout == layout
        if type(host).__name__ == "MambaPoolHost":
            bufs = [device.mamba_cache.temporal, *device.mamba_cache.conv]  # [layer, slot, ...]
            n_layers = bufs[0].shape[0]
            dev_idx, host_idx = torch.tensor([1, 4, 2]), torch.tensor([5, 0, 9])
        else:
            bufs = [b.unsqueeze(0) for b in (*device.k_buffer, *device.v_buffer)]
            n_layers = len(device.k_buffer)
            dev_idx = torch.arange(page_size, 3 * page_size) if page_size > 1 else torch.tensor([3, 7, 1])
            host_idx = torch.arange(4 * page_size, 6 * page_size) if page_size > 1 else torch.tensor([10, 2, 6])
        for b in bufs:
            b.copy_(torch.randn(b.shape, generator=g).to(b.dtype))
        want = [b[:, dev_idx].clone() for b in bufs]
        host.backup_from_device_all_layer(device, host_idx, dev_idx, io)
        for b in bufs:
            b.zero_()
        for layer in range(n_layers):
            host.load_to_device_per_layer(device, host_idx, dev_idx, layer, io)
        for b, w in zip(bufs, want):
            assert torch.equal(b[:, dev_idx], w)
            rest = torch.ones(b.shape[1], dtype=torch.bool)
            rest[dev_idx] = False
            assert not b[:, rest].any()

"""Torch reference implementations of SGLang's HiCache host<->device transfer ops, for CPU tensors.

SGLang 0.5.23's host pools (sglang/srt/mem_cache/pool_host/{mha,mla,mamba,dsa,unified}.py) import
these ops from `sgl_kernel.kvcacheio` and `sglang.kernels.ops.mamba.transfer_mamba` only on CUDA/ROCm
(XPU via pool_host/_kvcacheio.py). On the CPU runtime they are undefined names; cpu/hooks_hicache.py
sets the functions below into those modules' globals.

Each function keeps the keyword names and argument order of the op it stands in for (SGLang calls
them with keywords) and its addressing, in bytes:

* "kernel" ops address rows by byte arithmetic, like the CUDA kernels: a layer-first (lf) row is
  `base + index * item_size`; a page-first (pf) row is `base + index * layout_dim + layer * item_size`;
  page-head (ph) splits a row per head (`[page, head, page_size, layer, head_dim]`). All-layer ops take
  their layer-first side as a table of raw (host, on CPU) addresses, read and written through a byte view.
  Tensor operands are viewed through their own storage: an out-of-range index raises.
* "direct" ops index tensors (`tensor[index]`, page-first-direct `tensor[page, layer, offset]`), any strides.
Index tensors may live on any device and have any integer dtype; they are read on CPU as int64.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


def _index(indices: torch.Tensor) -> torch.Tensor:
    return indices.reshape(-1).to(device="cpu", dtype=torch.long)


def _indices(src_indices: torch.Tensor, dst_indices: torch.Tensor, op: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Both index sets as CPU int64 (of one length, else a ValueError); None when there is nothing to move."""
    if src_indices.numel() != dst_indices.numel():
        raise ValueError(f"{op}: {src_indices.numel()} source indices but {dst_indices.numel()} destination indices")
    if src_indices.numel() == 0:
        return None
    return _index(src_indices), _index(dst_indices)


# ----------------------------------------------------------------------------- byte addressing


def _storage_bytes(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A flat uint8 tensor over t's whole storage, and the byte offset of t's first element in it."""
    if t.device.type != "cpu":
        raise ValueError(f"CPU HiCache transfer got a {t.device} tensor; the CPU runtime only moves CPU tensors")
    storage = t.untyped_storage()
    flat = torch.empty(0, dtype=torch.uint8).set_(storage)
    return flat, t.data_ptr() - storage.data_ptr()


def _raw_bytes(address: int, nbytes: int) -> torch.Tensor:
    """A uint8 tensor aliasing `nbytes` of host memory at `address` (a pointer-table entry)."""
    if address == 0:
        raise ValueError("CPU HiCache transfer: null address in a layer pointer table")
    buf = (ctypes.c_uint8 * nbytes).from_address(address)
    return torch.frombuffer(buf, dtype=torch.uint8)


@dataclass
class _Rows:
    """Rows of `item` bytes, `stride` bytes apart, starting `offset` bytes into a memory region.

    The region is a tensor's storage (bounds-checked by as_strided) or, for a pointer-table entry,
    raw memory sized to exactly the rows an index set reaches.
    """

    item: int
    stride: int
    offset: int = 0
    tensor: torch.Tensor | None = None
    address: int | None = None

    def _view(self, n_rows: int) -> torch.Tensor:
        if self.tensor is not None:
            flat, base = _storage_bytes(self.tensor)
            return flat.as_strided((n_rows, self.item), (self.stride, 1), base + self.offset)
        assert self.address is not None
        flat = _raw_bytes(self.address + self.offset, (n_rows - 1) * self.stride + self.item)
        return flat.as_strided((n_rows, self.item), (self.stride, 1), 0)

    def read(self, idx: torch.Tensor) -> torch.Tensor:
        return self._view(int(idx.max()) + 1).index_select(0, idx)

    def write(self, idx: torch.Tensor, values: torch.Tensor) -> None:
        self._view(int(idx.max()) + 1).index_copy_(0, idx, values)


@dataclass
class _PageHeadRows:
    """One layer's rows in the page-head layout `[page, head, page_size, layer, head_dim]` (bytes).

    `layout_dim` is one token's bytes over all layers (`item * layer_num`); a token's row is split
    into `head_num` pieces of `item // head_num` bytes.
    """

    tensor: torch.Tensor
    item: int
    layout_dim: int
    layer_id: int
    page_size: int
    head_num: int

    def _view(self, n_pages: int) -> torch.Tensor:
        flat, base = _storage_bytes(self.tensor)
        ps, heads, dim = self.page_size, self.head_num, self.layout_dim
        head_bytes = self.item // heads
        return flat.as_strided(
            (n_pages, ps, heads, head_bytes),
            (ps * dim, dim // heads, ps * dim // heads, 1),
            base + self.layer_id * head_bytes,
        )

    def read(self, idx: torch.Tensor) -> torch.Tensor:
        view = self._view(int(idx.max()) // self.page_size + 1)
        return view[idx // self.page_size, idx % self.page_size].reshape(idx.numel(), self.item)

    def write(self, idx: torch.Tensor, values: torch.Tensor) -> None:
        view = self._view(int(idx.max()) // self.page_size + 1)
        view[idx // self.page_size, idx % self.page_size] = values.reshape(idx.numel(), self.head_num, -1)


_RowSet = _Rows | _PageHeadRows


def _copy(src: _RowSet, dst: _RowSet, src_indices: torch.Tensor, dst_indices: torch.Tensor, op: str) -> None:
    indices = _indices(src_indices, dst_indices, op)
    if indices is not None:
        dst.write(indices[1], src.read(indices[0]))


def _check_rows(t: torch.Tensor, row_bytes: int, op: str, name: str) -> None:
    """The kernels step rows by `row_bytes`; a tensor whose slot axis strides otherwise is a caller bug."""
    if t.dim() >= 1 and t.shape[0] > 1 and t.stride(0) * t.element_size() != row_bytes:
        raise ValueError(
            f"{op}: {name} rows are {t.stride(0) * t.element_size()} bytes apart, the op steps {row_bytes}"
        )


def _lf(t: torch.Tensor, item_size: int, op: str, name: str) -> _Rows:
    _check_rows(t, item_size, op, name)
    return _Rows(item=item_size, stride=item_size, tensor=t)


def _pf(t: torch.Tensor, item_size: int, layout_dim: int, layer_id: int, op: str, name: str) -> _Rows:
    _check_rows(t, layout_dim, op, name)
    return _Rows(item=item_size, stride=layout_dim, offset=layer_id * item_size, tensor=t)


def _ph(t: torch.Tensor, item_size: int, layout_dim: int, layer_id: int, page_size: int, head_num: int,
        op: str) -> _PageHeadRows:
    if item_size % head_num:
        raise ValueError(f"{op}: item_size {item_size} is not a multiple of head_num {head_num}")
    return _PageHeadRows(tensor=t, item=item_size, layout_dim=layout_dim, layer_id=layer_id,
                         page_size=page_size, head_num=head_num)


def _table(ptrs: torch.Tensor, num_layers: int, op: str, name: str) -> list[int]:
    """The addresses of a layer pointer table (uint64/int64 tensor, one entry per layer)."""
    if not isinstance(ptrs, torch.Tensor) or ptrs.dtype not in (torch.uint64, torch.int64) or ptrs.dim() != 1:
        raise ValueError(f"{op}: {name} must be a 1-D uint64 table of layer addresses")
    if ptrs.numel() < num_layers:
        raise ValueError(f"{op}: {name} has {ptrs.numel()} entries for {num_layers} layers")
    return [int(a) for a in ptrs[:num_layers].cpu().tolist()]


def _lf_tbl(address: int, item_size: int) -> _Rows:
    return _Rows(item=item_size, stride=item_size, address=address)


def _tables_to_tables(src_tbl: torch.Tensor, dst_tbl: torch.Tensor, num_layers: int, item_size: int,
                      src_indices: torch.Tensor, dst_indices: torch.Tensor, op: str, name: str) -> None:
    """Each layer of pointer table ``src_{name}`` into the same layer of ``dst_{name}`` (layer-first rows)."""
    pairs = zip(_table(src_tbl, num_layers, op, f"src_{name}"), _table(dst_tbl, num_layers, op, f"dst_{name}"))
    for s_addr, d_addr in pairs:
        _copy(_lf_tbl(s_addr, item_size), _lf_tbl(d_addr, item_size), src_indices, dst_indices, op)


def _tables_to_page_first(src_tbl: torch.Tensor, dst: torch.Tensor, num_layers: int, item_size: int,
                          layout_dim: int, src_indices: torch.Tensor, dst_indices: torch.Tensor, op: str,
                          names: tuple[str, str]) -> None:
    """Each layer of pointer table ``src_tbl`` (layer-first rows) into its layer of the page-first ``dst``;
    ``names``: the two operands' names in error messages."""
    for layer, s_addr in enumerate(_table(src_tbl, num_layers, op, names[0])):
        _copy(_lf_tbl(s_addr, item_size), _pf(dst, item_size, layout_dim, layer, op, names[1]),
              src_indices, dst_indices, op)


# ----------------------------------------------------------------------------- sgl_kernel.kvcacheio, kernel backend


def transfer_kv_per_layer(src_k: torch.Tensor, dst_k: torch.Tensor, src_v: torch.Tensor, dst_v: torch.Tensor,
                          src_indices: torch.Tensor, dst_indices: torch.Tensor, item_size: int,
                          block_quota: int = 2, num_warps_per_block: int = 32) -> None:
    """One layer, layer-first to layer-first, K and V."""
    op = "transfer_kv_per_layer"
    for s, d, n in ((src_k, dst_k, "k"), (src_v, dst_v, "v")):
        _copy(_lf(s, item_size, op, f"src_{n}"), _lf(d, item_size, op, f"dst_{n}"), src_indices, dst_indices, op)


def transfer_kv_per_layer_pf_lf(src_k: torch.Tensor, dst_k: torch.Tensor, src_v: torch.Tensor,
                                dst_v: torch.Tensor, src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                layer_id: int, item_size: int, src_layout_dim: int, block_quota: int = 2,
                                num_warps_per_block: int = 32) -> None:
    """Layer `layer_id` of a page-first host buffer into a layer-first device layer, K and V."""
    op = "transfer_kv_per_layer_pf_lf"
    for s, d, n in ((src_k, dst_k, "k"), (src_v, dst_v, "v")):
        _copy(_pf(s, item_size, src_layout_dim, layer_id, op, f"src_{n}"), _lf(d, item_size, op, f"dst_{n}"),
              src_indices, dst_indices, op)


def transfer_kv_per_layer_ph_lf(src_k: torch.Tensor, dst_k: torch.Tensor, src_v: torch.Tensor,
                                dst_v: torch.Tensor, src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                layer_id: int, item_size: int, src_layout_dim: int, page_size: int,
                                head_num: int, block_quota: int = 2, num_warps_per_block: int = 32) -> None:
    """Layer `layer_id` of a page-head host buffer into a layer-first device layer, K and V."""
    op = "transfer_kv_per_layer_ph_lf"
    for s, d, n in ((src_k, dst_k, "k"), (src_v, dst_v, "v")):
        _copy(_ph(s, item_size, src_layout_dim, layer_id, page_size, head_num, op),
              _lf(d, item_size, op, f"dst_{n}"), src_indices, dst_indices, op)


def transfer_kv_all_layer(src_k_layers: torch.Tensor, dst_k_layers: torch.Tensor, src_v_layers: torch.Tensor,
                          dst_v_layers: torch.Tensor, src_indices: torch.Tensor, dst_indices: torch.Tensor,
                          item_size: int, num_layers: int, block_quota: int = 2,
                          num_warps_per_block: int = 32) -> None:
    """All layers, layer-first to layer-first; both sides are layer pointer tables."""
    op = "transfer_kv_all_layer"
    for s_tbl, d_tbl, n in ((src_k_layers, dst_k_layers, "k"), (src_v_layers, dst_v_layers, "v")):
        _tables_to_tables(s_tbl, d_tbl, num_layers, item_size, src_indices, dst_indices, op, f"{n}_layers")


def transfer_kv_all_layer_lf_pf(src_k_layers: torch.Tensor, dst_k: torch.Tensor, src_v_layers: torch.Tensor,
                                dst_v: torch.Tensor, src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                item_size: int, dst_layout_dim: int, num_layers: int, block_quota: int = 2,
                                num_warps_per_block: int = 32) -> None:
    """All device layers (pointer table) into a page-first host buffer, K and V."""
    op = "transfer_kv_all_layer_lf_pf"
    for s_tbl, d, n in ((src_k_layers, dst_k, "k"), (src_v_layers, dst_v, "v")):
        _tables_to_page_first(s_tbl, d, num_layers, item_size, dst_layout_dim, src_indices, dst_indices, op,
                              (f"src_{n}_layers", f"dst_{n}"))


def transfer_kv_all_layer_lf_ph(src_k_layers: torch.Tensor, dst_k: torch.Tensor, src_v_layers: torch.Tensor,
                                dst_v: torch.Tensor, src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                item_size: int, dst_layout_dim: int, num_layers: int, page_size: int,
                                head_num: int, block_quota: int = 2, num_warps_per_block: int = 32) -> None:
    """All device layers (pointer table) into a page-head host buffer, K and V."""
    op = "transfer_kv_all_layer_lf_ph"
    for s_tbl, d, n in ((src_k_layers, dst_k, "k"), (src_v_layers, dst_v, "v")):
        for layer, s_addr in enumerate(_table(s_tbl, num_layers, op, f"src_{n}_layers")):
            _copy(_lf_tbl(s_addr, item_size), _ph(d, item_size, dst_layout_dim, layer, page_size, head_num, op),
                  src_indices, dst_indices, op)


def transfer_kv_per_layer_mla(src: torch.Tensor, dst: torch.Tensor, src_indices: torch.Tensor,
                              dst_indices: torch.Tensor, item_size: int, block_quota: int | None = None,
                              num_warps_per_block: int = 32) -> None:
    """One buffer (MLA latent, or a mamba state layer), layer-first to layer-first."""
    op = "transfer_kv_per_layer_mla"
    _copy(_lf(src, item_size, op, "src"), _lf(dst, item_size, op, "dst"), src_indices, dst_indices, op)


def transfer_kv_per_layer_mla_pf_lf(src: torch.Tensor, dst: torch.Tensor, src_indices: torch.Tensor,
                                    dst_indices: torch.Tensor, layer_id: int, item_size: int,
                                    src_layout_dim: int, block_quota: int | None = None,
                                    num_warps_per_block: int = 32) -> None:
    """Layer `layer_id` of one page-first host buffer into a layer-first device layer."""
    op = "transfer_kv_per_layer_mla_pf_lf"
    _copy(_pf(src, item_size, src_layout_dim, layer_id, op, "src"), _lf(dst, item_size, op, "dst"),
          src_indices, dst_indices, op)


def transfer_kv_all_layer_mla(src_layers: torch.Tensor, dst_layers: torch.Tensor, src_indices: torch.Tensor,
                              dst_indices: torch.Tensor, item_size: int, num_layers: int, block_quota: int = 2,
                              num_warps_per_block: int = 32) -> None:
    """All layers of one buffer, layer-first to layer-first; both sides are layer pointer tables."""
    _tables_to_tables(src_layers, dst_layers, num_layers, item_size, src_indices, dst_indices,
                      "transfer_kv_all_layer_mla", "layers")


def transfer_kv_all_layer_mla_lf_pf(src_layers: torch.Tensor, dst: torch.Tensor, src_indices: torch.Tensor,
                                    dst_indices: torch.Tensor, item_size: int, dst_layout_dim: int,
                                    num_layers: int, block_quota: int = 2, num_warps_per_block: int = 32) -> None:
    """All device layers of one buffer (pointer table) into a page-first host buffer."""
    _tables_to_page_first(src_layers, dst, num_layers, item_size, dst_layout_dim, src_indices, dst_indices,
                          "transfer_kv_all_layer_mla_lf_pf", ("src_layers", "dst"))


# ----------------------------------------------------------------------------- sglang.kernels.ops.mamba.transfer_mamba


def transfer_kv_mamba_pf_lf(src: torch.Tensor, dst: torch.Tensor, src_indices: torch.Tensor,
                            dst_indices: torch.Tensor, layer_id: int, item_size: int, src_layout_dim: int,
                            num_warps_per_item: int = 32) -> None:
    """Load: layer `layer_id` of a page-first mamba host buffer into one device state layer."""
    op = "transfer_kv_mamba_pf_lf"
    _copy(_pf(src, item_size, src_layout_dim, layer_id, op, "src"), _lf(dst, item_size, op, "dst"),
          src_indices, dst_indices, op)


def transfer_kv_mamba_lf_pf(src_ptrs: torch.Tensor, dst: torch.Tensor, src_indices: torch.Tensor,
                            dst_indices: torch.Tensor, item_size: int, dst_layout_dim: int, num_layers: int,
                            num_warps_per_item: int = 32) -> None:
    """Backup: every device state layer (pointer table) into a page-first mamba host buffer."""
    _tables_to_page_first(src_ptrs, dst, num_layers, item_size, dst_layout_dim, src_indices, dst_indices,
                          "transfer_kv_mamba_lf_pf", ("src_ptrs", "dst"))


# ----------------------------------------------------------------------------- sgl_kernel.kvcacheio, direct backend


def transfer_kv_direct(src_layers: Sequence[torch.Tensor], dst_layers: Sequence[torch.Tensor],
                       src_indices: torch.Tensor, dst_indices: torch.Tensor, page_size: int) -> None:
    """Pairwise `dst_layers[i][dst_indices] = src_layers[i][src_indices]` (slot axis 0, any strides)."""
    op = "transfer_kv_direct"
    if len(src_layers) != len(dst_layers):
        raise ValueError(f"{op}: {len(src_layers)} source layers but {len(dst_layers)} destination layers")
    indices = _indices(src_indices, dst_indices, op)
    if indices is None:
        return
    src_idx, dst_idx = indices
    for s, d in zip(src_layers, dst_layers):
        d.index_copy_(0, dst_idx.to(d.device), s.index_select(0, src_idx.to(s.device)).to(d.device))


def _pfd_pairs(host_ptrs: Sequence[torch.Tensor], device_ptrs: Sequence[torch.Tensor],
               op: str) -> list[tuple[torch.Tensor, int, torch.Tensor]]:
    """``(host tensor t, its layer j, device tensor t * n + j)`` for every layer-first device tensor of a
    page-first-direct op: the device list holds ``n`` layers per host tensor (K layers then V layers, or
    one buffer's layers)."""
    n_pf, n_lf = len(host_ptrs), len(device_ptrs)
    if n_pf not in (1, 2) or n_lf % n_pf:
        raise ValueError(f"{op}: {n_pf} page-first tensors and {n_lf} layer tensors do not pair up")
    n = n_lf // n_pf
    return [(host, j, device_ptrs[t * n + j]) for t, host in enumerate(host_ptrs) for j in range(n)]


def transfer_kv_per_layer_direct_pf_lf(src_ptrs: Sequence[torch.Tensor], dst_ptrs: Sequence[torch.Tensor],
                                       src_indices: torch.Tensor, dst_indices: torch.Tensor, layer_id: int,
                                       page_size: int) -> None:
    """Load from page-first-direct host tensors `[page, layer, page_offset, ...]` (1: MLA/mamba, 2: K, V)
    into layer-first device tensors: `dst_ptrs[t * n + j][d] = src_ptrs[t][s // ps, layer_id + j, s % ps]`."""
    op = "transfer_kv_per_layer_direct_pf_lf"
    pairs = _pfd_pairs(src_ptrs, dst_ptrs, op)
    indices = _indices(src_indices, dst_indices, op)
    if indices is None:
        return
    src_idx, dst_idx = indices
    page, offset = src_idx // page_size, src_idx % page_size
    for host, j, dst in pairs:
        values = host.select(1, layer_id + j)[page.to(host.device), offset.to(host.device)]
        dst.index_copy_(0, dst_idx.to(dst.device), values.to(dst.device))


def transfer_kv_all_layer_direct_lf_pf(src_ptrs: Sequence[torch.Tensor], dst_ptrs: Sequence[torch.Tensor],
                                       src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                       page_size: int) -> None:
    """Backup layer-first device tensors (K layers then V layers, or one buffer's layers) into
    page-first-direct host tensors: `dst_ptrs[t][d // ps, j, d % ps] = src_ptrs[t * n + j][s]`."""
    op = "transfer_kv_all_layer_direct_lf_pf"
    pairs = _pfd_pairs(dst_ptrs, src_ptrs, op)
    indices = _indices(src_indices, dst_indices, op)
    if indices is None:
        return
    src_idx, dst_idx = indices
    page, offset = dst_idx // page_size, dst_idx % page_size
    for host, j, src in pairs:
        values = src.index_select(0, src_idx.to(src.device)).to(host.device)
        host.select(1, j)[page.to(host.device), offset.to(host.device)] = values


# ----------------------------------------------------------------------------- tables for hooks_hicache


KVCACHEIO_OPS: dict[str, Callable[..., None]] = {
    fn.__name__: fn
    for fn in (
        transfer_kv_per_layer,
        transfer_kv_per_layer_pf_lf,
        transfer_kv_per_layer_ph_lf,
        transfer_kv_all_layer,
        transfer_kv_all_layer_lf_pf,
        transfer_kv_all_layer_lf_ph,
        transfer_kv_per_layer_mla,
        transfer_kv_per_layer_mla_pf_lf,
        transfer_kv_all_layer_mla,
        transfer_kv_all_layer_mla_lf_pf,
        transfer_kv_direct,
        transfer_kv_per_layer_direct_pf_lf,
        transfer_kv_all_layer_direct_lf_pf,
    )
}
MAMBA_OPS: dict[str, Callable[..., None]] = {
    fn.__name__: fn for fn in (transfer_kv_mamba_pf_lf, transfer_kv_mamba_lf_pf)
}
ALL_OPS: dict[str, Callable[..., None]] = {**KVCACHEIO_OPS, **MAMBA_OPS}

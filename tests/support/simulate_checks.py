"""The state of a simulated server's slots, and the invariants the radix adapter must keep (for tests).

Every radix node's ``(conv, temporal)`` is its token path's state and its ring is empty; every
running request's checkpoint + ring reproduces its consumed path's state.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.support.simulate_model import SimConfig, SimReq, ToyModel, rel_err

__all__ = ["SimInvariants"]


class SimInvariants:
    """The pool views and invariant checks of :class:`tests.support.simulate.Sim` (a
    mixin: it reads the attributes below, which ``Sim`` sets)."""

    cfg: SimConfig
    model: ToyModel
    cache: Any
    mamba_pool: Any
    running: list[SimReq]

    # -- pool views ---------------------------------------------------------------------------------

    @property
    def temporal(self) -> torch.Tensor:
        return self.mamba_pool.mamba_cache.temporal

    @property
    def conv(self) -> torch.Tensor:
        return self.mamba_pool.mamba_cache.conv[0]

    @property
    def write_pos(self) -> torch.Tensor:
        return self.mamba_pool.replayssm_write_pos

    @property
    def ring_map(self) -> torch.Tensor | None:
        """The slot -> ring row map of rings keyed by request row, or None (one ring per slot)."""
        from sglang_replayssm.radix.ring.pool import ring_pool

        view = ring_pool(self.mamba_pool)
        return None if view is None else view.rows

    def ring_row(self, slot: int) -> int:
        """The ring row holding ``slot``'s records."""
        ring_map = self.ring_map
        return slot if ring_map is None else int(ring_map[slot])

    def slot_state(self, slot: int) -> list[torch.Tensor]:
        """Checkpoint of ``slot`` folded with its live ring records (fp64), per layer."""
        from sglang_replayssm.kernels.naive import fold_records_fp64
        from sglang_replayssm.radix.read_copy.store import read_copy_of
        from sglang_replayssm.radix.ring.pool import ring_pool

        cache = self.mamba_pool.mamba_cache
        view = ring_pool(self.mamba_pool)
        if view is not None and read_copy_of(self.mamba_pool) is not None:  # the ring holds d~: replay exactly
            folded = view.folded_temporal(torch.tensor([slot]))
            full = cache.temporal[:, [slot]] if folded is None else folded
            return [full[li, 0].double() for li in range(self.cfg.mamba_layers)]
        count = int(self.write_pos[slot])
        row = self.ring_row(slot)
        return [
            fold_records_fp64(
                cache.temporal[li, slot],
                cache.replayssm_d[li, row],
                cache.replayssm_k[li, row],
                cache.replayssm_g[li, row],
                count,
                self.cfg.is_kda,
            )
            for li in range(self.cfg.mamba_layers)
        ]

    def cached_nodes(self) -> list[tuple[list[int], int]]:
        """``(token path, mamba slot)`` of every radix node holding a device mamba state."""
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

        core = self.cache.tree_core
        root = self.cache.root_node_handle()
        out = []
        for node in core.get_all_node_ids():
            value = core.get_component_device_value(node, ComponentType.MAMBA)
            if value is None or node == root:
                continue
            path: list[int] = []
            cur = node
            while cur is not None and cur != root:
                path = list(core.get_node_token_ids(cur)) + path
                cur = core.get_parent_node_id(cur)
            out.append((path, int(value.reshape(-1)[0])))
        return out

    def node_problems(self, tol: float = 1e-5) -> list[str]:
        """Radix nodes whose ring is not empty, or whose conv / temporal is not their path's."""
        problems = []
        for path, slot in self.cached_nodes():
            wp = int(self.write_pos[slot])
            if wp != 0:
                problems.append(f"node depth {len(path)} slot {slot}: write_pos {wp} != 0")
            want = self.model.oracle(path)
            windows = self.model.conv_window(path)
            for li in range(self.cfg.mamba_layers):
                err = rel_err(self.temporal[li, slot], want[li])
                if not err <= tol:
                    problems.append(
                        f"node depth {len(path)} slot {slot} layer {li}: temporal rel err {err:.3g}"
                    )
                if not torch.equal(self.conv[li, slot], windows[li]):
                    problems.append(
                        f"node depth {len(path)} slot {slot} layer {li}: conv window of another depth"
                    )
        return problems

    def live_problems(self, tol: float = 1e-5) -> list[str]:
        """Running requests whose checkpoint + ring (and conv) is not their consumed path's state."""
        problems = []
        for sreq in self.running:
            slot = int(sreq.req.kv.mamba_pool_idx)
            path = sreq.consumed
            want = self.model.oracle(path)
            got = self.slot_state(slot)
            windows = self.model.conv_window(path)
            for li in range(self.cfg.mamba_layers):
                err = rel_err(got[li], want[li])
                if not err <= tol:
                    problems.append(
                        f"{sreq.req.rid} depth {len(path)} slot {slot} layer {li}: state rel err {err:.3g}"
                    )
                if not torch.equal(self.conv[li, slot], windows[li]):
                    problems.append(f"{sreq.req.rid} depth {len(path)} slot {slot} layer {li}: conv mismatch")
        return problems

    def check(self, tol: float = 1e-5) -> None:
        """Raise AssertionError listing every violated invariant."""
        problems = self.node_problems(tol) + self.live_problems(tol)
        if problems:
            raise AssertionError(
                "; ".join(problems[:8]) + (f" (+{len(problems) - 8} more)" if len(problems) > 8 else "")
            )


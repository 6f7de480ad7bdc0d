"""The `ring_kernels` fix hands SGLang's packed_decode arguments to our ring decode correctly
(GDN and KDA argument layouts), and leaves every other call to SGLang's method."""

from __future__ import annotations

import pytest
import torch

from sglang_replayssm.kernels.ring_decode_ref import ring_decode_torch
from sglang_replayssm.radix.ring import kernel_binding as kernel_binding


def _case(is_kda: bool, B: int = 3, H: int = 2, HV: int = 4, K: int = 32, V: int = 32, L: int = 4):
    g = torch.Generator().manual_seed(1)
    slots = 6
    kw = dict(
        A_log=torch.rand(HV, generator=g), scale=K ** -0.5,
        dt_bias=torch.rand(HV * K if is_kda else HV, generator=g),
        ssm_states=torch.randn(slots, HV, V, K, generator=g) * 0.1,
        cache_indices=torch.tensor([4, -1, 1], dtype=torch.int32),
        num_v_heads=HV, head_v_dim=V,
        replayssm_d=torch.randn(slots, HV, L, V, generator=g),
        replayssm_k=torch.randn(slots, H, L, K, generator=g),
        replayssm_g=-torch.rand(slots, HV, L, *((K,) if is_kda else ()), generator=g),
        replayssm_write_pos=torch.tensor([2, 0, 3], dtype=torch.int32),
        replayssm_force_flush=None,
    )
    mixed_qkv = torch.randn(B, 2 * H * K + HV * V, generator=g)
    a = torch.randn(B, HV * K if is_kda else HV, generator=g)
    b = torch.randn(B, HV, generator=g)
    return mixed_qkv, a, b, kw


@pytest.mark.parametrize("is_kda", [False, True], ids=["gdn", "kda"])
def test_binding_passes_sglang_arguments_to_the_ring_kernel(monkeypatch, is_kda):
    mixed_qkv, a, b, kw = _case(is_kda)
    ours = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in kw.items()}
    monkeypatch.setattr(kernel_binding, "_ours_applies", lambda x, kwargs: True)
    monkeypatch.setattr(kernel_binding, "ring_decode", ring_decode_torch)
    got = kernel_binding.ring_packed_decode(None, None, mixed_qkv, a, b, is_kda=is_kda, **ours)

    # What SGLang's own packed_decode passes to its kernel (gdn_triton.py:96-118 / kda_triton.py:78-110).
    B, HV, V, K = mixed_qkv.shape[0], kw["num_v_heads"], kw["head_v_dim"], kw["ssm_states"].shape[-1]
    out = torch.empty(B, 1, HV, V)
    ref = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in kw.items()}
    ring_decode_torch(mixed_qkv, a.reshape(B, HV, K) if is_kda else a, b, kw["A_log"],
                      kw["dt_bias"].reshape(HV, K) if is_kda else kw["dt_bias"], kw["scale"], ref["ssm_states"],
                      ref["replayssm_d"], ref["replayssm_k"], ref["replayssm_g"], out, kw["cache_indices"],
                      kw["replayssm_write_pos"], None, use_qk_l2norm_in_kernel=True, is_kda=is_kda)
    assert got.shape == (1, B, HV, V)
    torch.testing.assert_close(got, out.transpose(0, 1), rtol=0, atol=0)
    for key in ("ssm_states", "replayssm_d", "replayssm_k", "replayssm_g"):
        torch.testing.assert_close(ours[key], ref[key], rtol=0, atol=0)


def test_binding_defers_to_sglang_without_ring_or_off_cuda():
    mixed_qkv, a, b, kw = _case(False)
    calls = []

    def original(kernel, *args, **kwargs):
        calls.append(kwargs)
        return "sglang"

    # CPU tensors: SGLang's method (the CPU runtime hooks it separately).
    assert kernel_binding.ring_packed_decode(original, None, mixed_qkv, a, b, is_kda=False, **kw) == "sglang"
    # No ring (ReplaySSM off): SGLang's packed decode, whatever the device.
    no_ring = {k: v for k, v in kw.items() if not k.startswith("replayssm_")}
    assert not kernel_binding._has_ring(no_ring)
    assert kernel_binding.ring_packed_decode(original, None, mixed_qkv, a, b, is_kda=True,
                                             lower_bound=-5.0, **kw) == "sglang"
    assert len(calls) == 2 and calls[1]["lower_bound"] == -5.0

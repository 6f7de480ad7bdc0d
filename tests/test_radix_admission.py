"""Deliverable 1 (admission): SGLang's real ``handle_linear_attn_backend`` with the adapter on/off.

SGLang 0.5.23 refuses ``--mamba-radix-cache-strategy extra_buffer`` / ``extra_buffer_lazy`` with
``--enable-linear-replayssm``. With the adapter they are admitted (for GDN, and for KDA while a
KDA snapshot fix is on); every other SGLang check in that function still fires, and combinations
the adapter cannot make exact fail with one line.
"""

from __future__ import annotations

import pytest

from sglang_replayssm import hook_table
from sglang_replayssm.radix import config, hooks
from sglang_replayssm.radix.admission import ReplaySSMArgsError


@pytest.fixture(scope="module", autouse=True)
def _adapter_installed():
    hooks.install()


def _handle(**overrides):
    """Run SGLang's resolution hook (as the arg pipeline imports it) on fresh server args."""
    from sglang.srt.arg_groups import attention_hook
    from sglang.srt.runtime_context import override_platform
    from sglang.srt.server_args import ServerArgs

    kwargs = {"model_path": "dummy", "enable_linear_replayssm": True}
    kwargs.update(overrides)
    server_args = ServerArgs(**kwargs)
    with override_platform(is_cuda=False):
        attention_hook.handle_linear_attn_backend(server_args)
    return server_args


def test_the_pipeline_sees_the_hooked_function():
    from sglang.srt.arg_groups.attention_hook import handle_linear_attn_backend

    assert hooks.hook_fn("admit_linear_attn") in hook_table.wrapped_hooks(handle_linear_attn_backend)


@pytest.mark.parametrize("strategy", ["extra_buffer", "extra_buffer_lazy"])
@pytest.mark.parametrize("adapter_on", [True, False], ids=["adapter-on", "adapter-off"])
def test_extra_buffer_admitted_with_the_decode_ring(strategy, adapter_on):
    with config.override(adapter_on):
        if adapter_on:
            _handle(mamba_radix_cache_strategy=strategy)
        else:
            with pytest.raises(ValueError, match="requires --mamba-radix-cache-strategy no_buffer"):
                _handle(mamba_radix_cache_strategy=strategy)


@pytest.mark.parametrize("adapter_on", [True, False], ids=["adapter-on", "adapter-off"])
def test_no_buffer_and_ring_off_are_untouched(adapter_on):
    with config.override(adapter_on):
        _handle(mamba_radix_cache_strategy="no_buffer")
        _handle(mamba_radix_cache_strategy="extra_buffer", enable_linear_replayssm=False)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"linear_attn_decode_backend": "flashinfer"}, "requires Triton, or Helion"),
        ({"linear_replayssm_cache_len": 0}, "must be >= 1"),
        ({"enable_linear_replayssm_spec": True}, "mutually exclusive"),
    ],
    ids=["decode-backend", "cache-len", "spec-flag"],
)
def test_sglang_validations_still_fire_with_extra_buffer(overrides, message):
    with config.override(True), pytest.raises(ValueError, match=message):
        _handle(mamba_radix_cache_strategy="extra_buffer", **overrides)


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and text.startswith("sglang-replayssm: ")
    return text


def _config_dir(tmp_path, name: str) -> str:
    """A model directory holding just the config.json of one of the package's tiny test models."""
    import json

    from sglang_replayssm import models

    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(models.model_config(models.SPECS[name], 2048)))
    return str(tmp_path)


def test_kda_extra_buffer_needs_a_kda_snapshot_fix(tmp_path):
    """Without force flush or track materialisation a KDA (or unreadable) model is refused, a GDN
    model is admitted; with either KDA fix a KDA model is admitted."""
    kda, gdn = _config_dir(tmp_path / "kda", "tiny-kda"), _config_dir(tmp_path / "gdn", "tiny-gdn")
    unreadable = tmp_path / "no-config"  # a local directory without config.json (no hub lookup)
    unreadable.mkdir()
    with config.override(True, kda_force_flush=False, materialize_track=False):
        for path, what in ((kda, "a KDA model"), (str(unreadable), "config could not be read")):
            with pytest.raises(ReplaySSMArgsError) as info:
                _handle(model_path=path, mamba_radix_cache_strategy="extra_buffer")
            text = _one_line(info.value)
            assert "kda_force_flush or materialize_track" in text and what in text
        _handle(model_path=gdn, mamba_radix_cache_strategy="extra_buffer")
    for fix in ("kda_force_flush", "materialize_track"):
        with config.override(False, admission=True, cursor_reset=True, **{fix: True}):
            _handle(model_path=kda, mamba_radix_cache_strategy="extra_buffer")


def test_extra_buffer_needs_the_cursor_choke_point():
    with config.override(True, cursor_reset=False):
        with pytest.raises(ReplaySSMArgsError) as info:
            _handle(mamba_radix_cache_strategy="extra_buffer_lazy")
    assert "cursor_reset" in _one_line(info.value)


@pytest.mark.parametrize("flag", ["enable_mixed_chunk", "enable_streaming_session"])
@pytest.mark.parametrize("fixes", ["adapter-on", "extend-fold-off", "adapter-off"])
def test_mixed_chunk_and_streaming_session_with_the_decode_ring(flag, fixes):
    """Mixed batches and streaming-session turns run extend kernels over slots with pending ring
    records. SGLang accepts both silently; the adapter admits them while its extend_fold fix folds
    those records first, and refuses them with one line when that fix is off."""
    switches = {"adapter-on": {}, "extend-fold-off": {"extend_fold": False}, "adapter-off": None}[fixes]
    with config.override(switches is not None, **(switches or {})):
        if fixes == "extend-fold-off":
            with pytest.raises(ReplaySSMArgsError) as info:
                _handle(mamba_radix_cache_strategy="no_buffer", **{flag: True})
            text = _one_line(info.value)
            assert "--" + flag.replace("_", "-") in text and "extend_fold" in text
        else:
            _handle(mamba_radix_cache_strategy="no_buffer", **{flag: True})
            if switches is not None:  # (SGLang alone refuses extra_buffer with the ring anyway)
                _handle(mamba_radix_cache_strategy="extra_buffer", **{flag: True})


def test_guard_is_restored_after_the_call():
    from sglang.srt.arg_groups import attention_hook
    from sglang.srt.arg_groups.overrides import mamba_extra_buffer_of

    with config.override(True):
        _handle(mamba_radix_cache_strategy="extra_buffer")
        with pytest.raises(ValueError):
            _handle(mamba_radix_cache_strategy="extra_buffer", linear_replayssm_cache_len=0)
    assert attention_hook.mamba_extra_buffer_of is mamba_extra_buffer_of


@pytest.mark.parametrize("mode", ["prefill", "decode"])
@pytest.mark.parametrize("adapter_on", [True, False], ids=["adapter-on", "adapter-off"])
def test_pd_disaggregation_with_the_decode_ring(mode, adapter_on):
    """SGLang refuses the decode ring under PD with a ValueError (a traceback at launch). The adapter
    admits a decode server (radix/pd/decode_pool.py: its pool gets the ring; SGLang's own check runs answered) and
    refuses a prefill server, or a decode server with the pd_decode_ring fix off, in one line."""
    with config.override(adapter_on):
        if adapter_on and mode == "decode":
            _handle(mamba_radix_cache_strategy="no_buffer", disaggregation_mode=mode)
            with config.override(True, pd_decode_ring=False), pytest.raises(ReplaySSMArgsError) as info:
                _handle(mamba_radix_cache_strategy="no_buffer", disaggregation_mode=mode)
            assert "pd_decode_ring" in _one_line(info.value)
        elif adapter_on:
            with pytest.raises(ReplaySSMArgsError) as info:
                _handle(mamba_radix_cache_strategy="no_buffer", disaggregation_mode=mode)
            assert f"--disaggregation-mode {mode}" in _one_line(info.value)
        else:
            with pytest.raises(ValueError, match="PD disaggregation"):
                _handle(mamba_radix_cache_strategy="no_buffer", disaggregation_mode=mode)


def test_lazy_extra_buffer_without_overlap_is_refused():
    """SGLang sizes the ping-pong buffer from the overlap flag; lazy mode then indexes a missing
    second entry at the first decode track boundary (see the simulation test in
    test_radix_defects.py). The adapter refuses the combination it admits, with one line."""
    with config.override(True):
        with pytest.raises(ReplaySSMArgsError) as info:
            _handle(mamba_radix_cache_strategy="extra_buffer_lazy", disable_overlap_schedule=True)
        assert "--disable-overlap-schedule" in _one_line(info.value)
        _handle(mamba_radix_cache_strategy="extra_buffer", disable_overlap_schedule=True)


def test_unified_memory_is_refused_with_the_decode_ring_in_one_line():
    """SGLang's unified pool drops ``enable_linear_replayssm`` (its ``_init_mamba_pool`` takes it and passes it to
    nothing): the server would run without the ring, so the flags are refused together; apart they start."""
    import inspect

    from sglang.srt.mem_cache.unified_memory_pool import UnifiedHybridReqToTokenPool

    body = inspect.getsource(UnifiedHybridReqToTokenPool._init_mamba_pool).split("):\n", 1)[1]  # past the signature
    assert not any("linear_replayssm" in line.split("#")[0] for line in body.splitlines()), "SGLang now uses the flag"
    with config.override(True):
        with pytest.raises(ReplaySSMArgsError) as err:
            _handle(enable_unified_memory=True)
        assert "--enable-unified-memory" in _one_line(err.value)
        _handle(mamba_radix_cache_strategy="no_buffer")  # the ring alone

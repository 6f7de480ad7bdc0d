"""Server-argument admission: extra_buffer / extra_buffer_lazy with ``--enable-linear-replayssm``.

SGLang 0.5.23 refuses every extra_buffer strategy with the decode ring in
``handle_linear_attn_backend`` because the ping-pong donation does not reset ring cursors. With
the adapter's cursor choke point, track snapshots and (for KDA) force flush, that path is exact,
so the one ``mamba_extra_buffer_of(...)`` guard is answered "no extra buffer" for the duration of
SGLang's own function; every other check in it (decode backend, PD disaggregation, cache length,
spec-flag exclusivity) still runs unchanged.

Refused here, each with one line naming the flags:

* extra_buffer when the cursor choke point is off (donated / kept ping-pong slots would keep a
  previous owner's cursor);
* extra_buffer for a KDA model (or one whose config cannot be read) when neither KDA snapshot fix
  (``kda_force_flush``, ``materialize_track``) is on: KDA does not flush at track boundaries;
* ``--enable-mixed-chunk`` with the decode ring while the ``extend_fold`` fix is off: decode rows
  of a mixed batch run the extend kernels, which read ``temporal`` only and ignore pending ring
  records (with the fix, :mod:`movers` folds them before every extend forward);
* ``--enable-streaming-session`` with the decode ring while ``extend_fold`` is off: the next turn
  of a session extends the kept slot with those same kernels;
* ``--enable-unified-memory`` with the decode ring: SGLang's ``UnifiedHybridReqToTokenPool._init_mamba_pool``
  accepts ``enable_linear_replayssm`` but does not pass it on, so the flag would be silently dropped;
* ``--disaggregation-mode prefill`` with the decode ring (a prefill server never decodes), and
  ``decode`` while the ``pd_decode_ring`` fix is off (the pd room admits it, wiring SGLang's
  decode-side pool for the ring and answering SGLang's own PD refusal);
* what a feature room adds (:func:`add_check`, run first, whatever the fixes): the read copy refuses
  ``SGLANG_REPLAYSSM_READ_COPY`` with a bad value, without the decode ring, with speculative decoding
  or a non-fp32 ``--mamba-ssm-dtype`` (radix/read_copy/startup.py);
* ``extra_buffer_lazy`` with ``--disable-overlap-schedule``: SGLang then sizes a one-entry
  ping-pong buffer, and its lazy prealloc indexes the second entry at the first decode track
  boundary (an IndexError in ``ScheduleBatch.mamba_lazy_prealloc_at_boundary``; not ring-specific).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from sglang_replayssm.radix import config
from sglang_replayssm.strategies import STRATEGIES, Disaggregation

__all__ = ["ReplaySSMArgsError", "add_check", "admit_linear_attn_args", "use_disaggregation"]

_EXTRA_BUFFER = ("extra_buffer", "extra_buffer_lazy")
#: The module whose global ``mamba_extra_buffer_of`` SGLang's guard calls
#: (sglang/srt/arg_groups/attention_hook.py:417).
_GUARD_MODULE = "sglang.srt.arg_groups.attention_hook"



def add_check(name: str, check: Callable[[Any], None]) -> None:
    """Run ``check(server_args)`` before every admission (idempotent per name; ``STRATEGIES.checks``)."""
    STRATEGIES.checks[name] = check


def use_disaggregation(admit: Disaggregation) -> None:
    """The pd room's admission of ``--disaggregation-mode`` (idempotent; ``STRATEGIES.disaggregation``)."""
    STRATEGIES.disaggregation = admit


class ReplaySSMArgsError(SystemExit):
    """A server-argument combination the adapter cannot make exact.

    A SystemExit, so the launcher prints exactly its one-line message (no traceback) and exits 1,
    like argparse's own errors; nothing in SGLang's startup path swallows it as an Exception."""

    def __init__(self, message: str) -> None:
        super().__init__(message)

    def __str__(self) -> str:
        return str(self.code)


def _value(server_args: Any, name: str, default: Any = None) -> Any:
    """A field as resolved so far (declarations over the record), falling back to the record."""
    try:
        from sglang.srt.arg_groups.overrides import resolving_view

        return getattr(resolving_view(server_args), name)
    except Exception:
        return getattr(server_args, name, default)


def _model_is_kda(server_args: Any) -> bool | None:
    """True/False when the model config can be read, None when it cannot."""
    try:
        from sglang.srt.arg_groups.overrides import model_config_of
        from sglang.srt.configs.model_config import uses_kda_attention

        return bool(uses_kda_attention(model_config_of(server_args).hf_config))
    except Exception:
        return None


def _check_extra_buffer(server_args: Any, strategy: str) -> None:
    if not config.enabled("cursor_reset"):
        raise ReplaySSMArgsError(
            f"sglang-replayssm: --mamba-radix-cache-strategy {strategy} with --enable-linear-replayssm "
            "needs the cursor_reset fix (remove it from SGLANG_REPLAYSSM_DISABLE_FIXES)."
        )
    if config.enabled("kda_force_flush") or config.enabled("materialize_track"):
        return
    is_kda = _model_is_kda(server_args)
    if is_kda is not False:
        what = "a KDA model" if is_kda else "a model whose config could not be read"
        raise ReplaySSMArgsError(
            f"sglang-replayssm: --mamba-radix-cache-strategy {strategy} with --enable-linear-replayssm "
            f"on {what} needs the kda_force_flush or materialize_track fix."
        )


def admit_linear_attn_args(original: Callable[[Any], Any], server_args: Any) -> Any:
    """Run SGLang's ``handle_linear_attn_backend`` with the extra_buffer guard answered by us.

    Invariant: with the fix off, or without ``--enable-linear-replayssm``, SGLang's function runs
    untouched. With it on, the only SGLang check skipped is the extra_buffer refusal, and only
    when :func:`_check_extra_buffer` accepted the combination.
    """
    for check in STRATEGIES.checks.values():
        check(server_args)
    if not config.enabled("admission") or not _value(server_args, "enable_linear_replayssm", False):
        return original(server_args)
    if _value(server_args, "enable_unified_memory", False):
        raise ReplaySSMArgsError(
            "sglang-replayssm: --enable-unified-memory with --enable-linear-replayssm is unsupported: SGLang "
            "0.5.23's unified pool never allocates the decode ring (it drops the flag), so the server would "
            "decode without ReplaySSM; drop one of the two flags."
        )
    if _value(server_args, "enable_mixed_chunk", False) and not config.enabled("extend_fold"):
        raise ReplaySSMArgsError(
            "sglang-replayssm: --enable-mixed-chunk with --enable-linear-replayssm is unsupported "
            "without the extend_fold fix: mixed batches run decode rows through extend kernels that "
            "ignore pending ring records."
        )
    if _value(server_args, "enable_streaming_session", False) and not config.enabled("extend_fold"):
        raise ReplaySSMArgsError(
            "sglang-replayssm: --enable-streaming-session with --enable-linear-replayssm is unsupported "
            "without the extend_fold fix: a session's next turn extends its slot with kernels that "
            "ignore pending ring records."
        )
    disaggregation = _value(server_args, "disaggregation_mode", "null")
    if disaggregation not in (None, "null"):  # PD: the decode server only (radix/pd/)
        admit = STRATEGIES.disaggregation
        if admit is None:
            raise RuntimeError("sglang-replayssm: the pd room is not installed (radix.hooks.register)")
        with admit(disaggregation, ReplaySSMArgsError, _GUARD_MODULE):
            return _admit_aggregated(original, server_args)
    return _admit_aggregated(original, server_args)


def _admit_aggregated(original: Callable[[Any], Any], server_args: Any) -> Any:
    """The radix-strategy part of :func:`admit_linear_attn_args`."""
    strategy = _value(server_args, "mamba_radix_cache_strategy", None)
    radix_off = bool(_value(server_args, "disable_radix_cache", False))
    if radix_off or strategy not in _EXTRA_BUFFER:
        # no_buffer, or auto (resolved later; re-checked when this runs on the resolved value).
        return original(server_args)
    if strategy == "extra_buffer_lazy" and _value(server_args, "disable_overlap_schedule", False):
        raise ReplaySSMArgsError(
            "sglang-replayssm: --mamba-radix-cache-strategy extra_buffer_lazy needs overlap scheduling "
            "(SGLang 0.5.23 sizes a one-entry ping-pong buffer without it); drop --disable-overlap-schedule."
        )
    _check_extra_buffer(server_args, strategy)
    module = importlib.import_module(_GUARD_MODULE)
    guard = module.__dict__.get("mamba_extra_buffer_of")
    if guard is None:
        return original(server_args)
    setattr(module, "mamba_extra_buffer_of", lambda cfg: False)  # noqa: B010 (a module global, looked up at call time)
    try:
        return original(server_args)
    finally:
        setattr(module, "mamba_extra_buffer_of", guard)  # noqa: B010

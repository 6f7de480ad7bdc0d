"""Bad flags and unsupported combinations fail at startup with one clear line and a non-zero exit;
the plugin refuses any SGLang other than the pinned release, naming both versions."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sglang_replayssm import SGLANG_PINNED_VERSION
from sglang_replayssm.models import make_models
from sglang_replayssm.version_check import SGLangVersionError, installed_sglang_version, require_pinned_sglang
from tests.support.serve import user_env


def _launch(args: list[str], extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    model = make_models(names=["tiny-gdn"], log=lambda *a: None)["tiny-gdn"]
    env = user_env("replayssm_cpu,replayssm_radix", extra_env)
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--device", "cpu", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


_NO_EXTEND_FOLD = {"SGLANG_REPLAYSSM_DISABLE_FIXES": "extend_fold"}
CASES = [
    (["--mamba-radix-cache-strategy", "bogus"], None, "invalid choice: 'bogus'"),
    (["--enable-linear-replayssm", "--enable-mixed-chunk", "--mamba-radix-cache-strategy", "extra_buffer"],
     _NO_EXTEND_FOLD, "sglang-replayssm: --enable-mixed-chunk with --enable-linear-replayssm is unsupported"),
    (["--enable-linear-replayssm", "--mamba-radix-cache-strategy", "extra_buffer_lazy",
      "--disable-overlap-schedule"], None, "sglang-replayssm: --mamba-radix-cache-strategy extra_buffer_lazy"),
    (["--enable-linear-replayssm", "--disaggregation-mode", "prefill"], None,
     "sglang-replayssm: --disaggregation-mode prefill with --enable-linear-replayssm is unsupported"),
    (["--enable-linear-replayssm", "--disaggregation-mode", "decode"], {"SGLANG_REPLAYSSM_DISABLE_FIXES": "pd_decode_ring"},
     "sglang-replayssm: --disaggregation-mode decode with --enable-linear-replayssm is unsupported"),
    (["--enable-linear-replayssm"], {"SGLANG_REPLAYSSM_RECORD_TOKENS": "lots"},
     "sglang-replayssm: SGLANG_REPLAYSSM_RECORD_TOKENS='lots': expected a number of tokens (0 turns records off)"),
]


@pytest.mark.server
@pytest.mark.parametrize(("args", "env", "message"), CASES,
                         ids=["bad-value", "mixed-chunk-without-extend-fold", "lazy-no-overlap", "pd-prefill",
                              "pd-decode-without-pd-decode-ring", "bad-setting"])
def test_bad_startup_fails_with_one_clear_line(args, env, message):
    proc = _launch(args, env)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert message in last, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_version_pin_names_both_versions():
    assert installed_sglang_version() == SGLANG_PINNED_VERSION
    require_pinned_sglang()  # the installed release passes
    with pytest.raises(SGLangVersionError) as info:
        require_pinned_sglang("0.5.22")
    assert "0.5.22" in str(info.value) and SGLANG_PINNED_VERSION in str(info.value)


def test_plugin_registers_nothing_on_another_version(monkeypatch, caplog):
    from sglang_replayssm import plugin

    monkeypatch.setattr(plugin, "require_pinned_sglang",
                        lambda: require_pinned_sglang("0.6.0"))
    called = []
    monkeypatch.setattr("sglang_replayssm.radix.hooks.register", lambda: called.append(1) or "on")
    plugin._enabled.clear()
    with caplog.at_level("ERROR", logger="sglang_replayssm"):
        plugin.register_radix_adapter()
    assert not called
    assert any("0.6.0" in r.getMessage() and SGLANG_PINNED_VERSION in r.getMessage() for r in caplog.records)

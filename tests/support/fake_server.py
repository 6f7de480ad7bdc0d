"""A stand-in for an SGLang server: the HTTP subset the bench uses, with no model behind it.

It answers ``/health``, ``/model_info``, ``/metrics``, ``/flush_cache`` and streaming
``/generate`` with ``input_ids``. With ``spec_tokens_per_verify=k`` it reports speculative decoding as
SGLang's meta_info does (``spec_verify_ct``: one verify per k output tokens after the first,
``spec_num_correct_drafts``: k - 1 per full verify). Outputs are a deterministic function of the prompt (so greedy
agreement can be exercised), ``cached_tokens`` is the longest prefix shared with any earlier
prompt+output[:-1] (an ideal token-granular radix cache: the KV a server computed), and the Prometheus counters mirror SGLang's
names. For tests and for dry runs of the bench: ``python tests/support/fake_server.py`` (it imports only aiohttp, so it
runs from any directory by its path).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web


def fake_output(prompt: Sequence[int], n: int, vocab_size: int, salt: str = "") -> list[int]:
    """``n`` token ids determined by the prompt (and ``salt``)."""
    seed = hashlib.sha256((salt + ",".join(map(str, prompt))).encode()).digest()
    out = []
    for i in range(n):
        h = hashlib.sha256(seed + i.to_bytes(4, "little")).digest()
        out.append(int.from_bytes(h[:4], "little") % vocab_size)
    return out


class FakeState:
    def __init__(self, model_path: str, vocab_size: int, salt: str, incremental: bool,
                 step_s: float, metrics: bool, spec_tokens_per_verify: int = 0) -> None:
        self.model_path = model_path
        self.vocab_size = vocab_size
        self.salt = salt
        self.incremental = incremental
        self.step_s = step_s
        self.metrics = metrics
        self.spec_tokens_per_verify = spec_tokens_per_verify
        self.cache: list[tuple[int, ...]] = []
        self.prompt_tokens_total = 0
        self.cached_tokens_total = 0
        self.requests = 0
        self.exit_on_generate = False  # simulate a server crash (process exit) on /generate

    def cached(self, prompt: Sequence[int]) -> int:
        best = 0
        for seq in self.cache:
            n = 0
            for a, b in zip(seq, prompt):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return min(best, max(len(prompt) - 1, 0))


STATE = web.AppKey("state", FakeState)


def _spec_meta(completion: int, per_verify: int) -> dict[str, int]:
    """SGLang's spec meta_info after ``completion`` tokens: the first from prefill, then verifies of
    ``per_verify`` tokens (accepted drafts + bonus; the last one may be cut by max_new_tokens)."""
    verify = -(-(completion - 1) // per_verify)
    return {"spec_verify_ct": verify, "spec_num_correct_drafts": max(completion - 1 - verify, 0)}


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _model_info(request: web.Request) -> web.Response:
    st: FakeState = request.app[STATE]
    return web.json_response({"model_path": st.model_path, "tokenizer_path": st.model_path})


async def _metrics(request: web.Request) -> web.Response:
    st: FakeState = request.app[STATE]
    if not st.metrics:
        return web.Response(status=404)
    lines = [
        "# TYPE sglang:prompt_tokens_total counter",
        f'sglang:prompt_tokens_total{{model_name="fake",is_streaming="true"}} {float(st.prompt_tokens_total)}',
        "# TYPE sglang:num_requests_total counter",
        f'sglang:num_requests_total{{model_name="fake",is_streaming="true"}} {float(st.requests)}',
    ]
    if st.cached_tokens_total:
        lines.append(f'sglang:cached_tokens_total{{model_name="fake",cache_source="device"}} '
                     f"{float(st.cached_tokens_total)}")
    return web.Response(text="\n".join(lines) + "\n")


async def _flush(request: web.Request) -> web.Response:
    request.app[STATE].cache.clear()
    return web.Response(status=200)


async def _generate(request: web.Request) -> web.StreamResponse:
    st: FakeState = request.app[STATE]
    if st.exit_on_generate:
        print("Scheduler hit an exception: simulated crash", flush=True)
        os._exit(3)
    body: dict[str, Any] = await request.json()
    prompt = list(body["input_ids"])
    n = int(body["sampling_params"]["max_new_tokens"])
    cached = st.cached(prompt)
    out = fake_output(prompt, n, st.vocab_size, st.salt)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(1, n + 1):
        await asyncio.sleep(st.step_s)
        meta = {"prompt_tokens": len(prompt), "completion_tokens": i, "cached_tokens": cached}
        if st.spec_tokens_per_verify:
            meta.update(_spec_meta(i, st.spec_tokens_per_verify))
        ids = out[i - 1:i] if st.incremental else out[:i]
        await resp.write(f"data: {json.dumps({'output_ids': ids, 'meta_info': meta})}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    st.cache.append(tuple(prompt + out[:-1]))  # the last sampled token's KV is never computed
    st.prompt_tokens_total += len(prompt)
    st.cached_tokens_total += cached
    st.requests += 1
    return resp


def make_app(model_path: str = "", vocab_size: int = 1000, salt: str = "", incremental: bool = False,
             step_s: float = 0.0, metrics: bool = True, exit_on_generate: bool = False,
             spec_tokens_per_verify: int = 0) -> web.Application:
    app = web.Application()
    app[STATE] = FakeState(model_path, vocab_size, salt, incremental, step_s, metrics, spec_tokens_per_verify)
    app[STATE].exit_on_generate = exit_on_generate
    app.router.add_get("/health", _health)
    app.router.add_get("/model_info", _model_info)
    app.router.add_get("/metrics", _metrics)
    app.router.add_post("/flush_cache", _flush)
    app.router.add_post("/generate", _generate)
    return app


class FakeServer:
    """``with FakeServer(**make_app_kwargs) as url:`` serves in a background thread."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def __enter__(self) -> str:
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("fake server did not start")
        return self.url

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        self._runner = web.AppRunner(make_app(**self.kwargs))
        loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(self._runner.cleanup())
        loop.close()

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)


def write_fake_model_dir(path: Path, vocab_size: int = 1000, linear: bool = True) -> Path:
    """A model directory with only what the bench reads: config.json and a word-level tokenizer."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    path.mkdir(parents=True, exist_ok=True)
    vocab = {"<unk>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "eos_token": "<eos>"}))
    layers = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    config: dict[str, Any] = {"model_type": "qwen3_next", "num_hidden_layers": 4, "vocab_size": vocab_size}
    config["layer_types"] = layers if linear else ["full_attention"] * 4
    (path / "config.json").write_text(json.dumps(config))
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model-path", default="")
    p.add_argument("--vocab-size", type=int, default=1000)
    p.add_argument("--step-s", type=float, default=0.0)
    p.add_argument("--salt", default="")
    p.add_argument("--exit-on-generate", action="store_true", help="die on the first /generate (a crash)")
    args, _unknown = p.parse_known_args(argv)  # tolerate real server flags
    app = make_app(args.model_path, args.vocab_size, args.salt, step_s=args.step_s,
                   exit_on_generate=args.exit_on_generate)
    web.run_app(app, host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

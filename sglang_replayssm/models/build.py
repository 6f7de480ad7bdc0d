"""Embedded test models: build them into a directory (atomically, skipping complete copies), and the CLI."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from sglang_replayssm.models.configs import generation_config, model_config
from sglang_replayssm.models.corpus import _tokenizer_config, _tokenizer_json, tokenizer_vocab_size
from sglang_replayssm.models.specs import (
    _MODEL_FILES,
    BUILDER_VERSION,
    DEFAULT_OUT,
    MARKER,
    MODEL_NAMES,
    REAL_SHAPE_NAMES,
    SPECS,
    WEIGHTS_FILE,
    ModelSpec,
)
from sglang_replayssm.models.weights import _checkpoint_state_dict, _hf_model, weight_dtype


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _build_into(spec: ModelSpec, dest: Path) -> dict[str, Any]:
    """Write every file of ``spec`` into the (empty) directory ``dest``; returns the marker."""
    from safetensors.torch import save_file

    vocab = tokenizer_vocab_size()
    cfg = model_config(spec, vocab)
    model = _hf_model(spec, cfg)
    sd = _checkpoint_state_dict(spec, model)
    if spec.mtp:
        from sglang_replayssm.models.mtp import mtp_config, mtp_state_dict

        sd.update({k: v.to(weight_dtype(spec)) for k, v in mtp_state_dict(spec, cfg, model).items()})
        cfg = {**cfg, **mtp_config(cfg)}
    save_file({k: sd[k] for k in sorted(sd)}, str(dest / WEIGHTS_FILE), metadata={"format": "pt"})
    _write_json(dest / "config.json", cfg)
    _write_json(dest / "generation_config.json", generation_config())
    (dest / "tokenizer.json").write_text(_tokenizer_json())
    _write_json(dest / "tokenizer_config.json", _tokenizer_config())
    for name in _MODEL_FILES:
        os.chmod(dest / name, 0o644)
    files = {name: _sha256_file(dest / name) for name in _MODEL_FILES}
    content = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    n_params = sum(int(t.numel()) for t in sd.values())
    marker = {
        "builder_version": BUILDER_VERSION,
        "name": spec.name,
        "spec_hash": spec.spec_hash(),
        "content_hash": content,
        "files": {name: {"sha256": digest, "size": (dest / name).stat().st_size} for name, digest in files.items()},
        "num_parameters": n_params,
    }
    _write_json(dest / MARKER, marker)
    return marker


def read_marker(model_dir: Path) -> dict[str, Any] | None:
    """The marker of a built embedded model, or None."""
    try:
        return json.loads((Path(model_dir) / MARKER).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def is_complete(model_dir: Path, spec: ModelSpec, verify_hashes: bool = False) -> bool:
    """Whether ``model_dir`` holds a complete build of ``spec`` by this builder version."""
    marker = read_marker(model_dir)
    if not marker or marker.get("builder_version") != BUILDER_VERSION or marker.get("spec_hash") != spec.spec_hash():
        return False
    for name in _MODEL_FILES:
        info = marker.get("files", {}).get(name)
        path = Path(model_dir) / name
        if not info or not path.is_file() or path.stat().st_size != info.get("size"):
            return False
        if verify_hashes and _sha256_file(path) != info.get("sha256"):
            return False
    return True


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_model(spec: ModelSpec, out: Path, force: bool = False, log: Any = print) -> Path:
    """Build ``spec`` as ``out/<name>`` unless a complete same-version copy is already there."""
    out = Path(out)
    target = out / spec.name
    with _lock(out / f".{spec.name}.lock"):
        if not force and is_complete(target, spec):
            log(f"[make-models] {spec.name}: up to date at {target}")
            return target
        t0 = time.monotonic()
        log(f"[make-models] {spec.name}: building ({spec.family}, {spec.shape.get('hidden_size')} hidden, "
            f"{spec.shape.get('num_hidden_layers')} layers, {spec.weight_dtype}) ...")
        tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}.tmp-", dir=out))
        try:
            marker = _build_into(spec, tmp)
            os.chmod(tmp, 0o755)
            if target.exists():
                trash = Path(tempfile.mkdtemp(prefix=f".{spec.name}.old-", dir=out))
                os.rename(target, trash / spec.name)
                os.rename(tmp, target)
                shutil.rmtree(trash, ignore_errors=True)
            else:
                os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        size = sum(info["size"] for info in marker["files"].values())
        log(f"[make-models] {spec.name}: {marker['num_parameters'] / 1e6:.2f} M params, {size / 1e6:.1f} MB, "
            f"{time.monotonic() - t0:.1f} s -> {target}")
        return target


def make_models(out: Path = DEFAULT_OUT, names: Iterable[str] = MODEL_NAMES, force: bool = False,
                log: Any = print) -> dict[str, Path]:
    """Build the named embedded models under ``out``; returns name -> model directory."""
    names = list(names)
    unknown = [n for n in names if n not in SPECS]
    if unknown:
        raise ValueError(f"unknown model name(s) {unknown}; known: {', '.join(SPECS)}")
    Path(out).mkdir(parents=True, exist_ok=True)
    return {name: build_model(SPECS[name], Path(out), force=force, log=log) for name in names}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang-replayssm make-models", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--names", nargs="+", choices=list(SPECS), default=list(MODEL_NAMES),
                        help=f"which models to build (default: {' '.join(MODEL_NAMES)}; the real-shape "
                             f"bfloat16 models {' '.join(REAL_SHAPE_NAMES)} are built only when named)")
    parser.add_argument("--force", action="store_true", help="rebuild even when an up-to-date copy exists")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    built = make_models(args.out, args.names, force=args.force)
    for name, path in built.items():
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Stub: sglang/benchmark/datasets/mmmu.py imports ``datasets`` at module level, and SGLang's test kits
(``sglang.test.kits``, which the GPU tests build pools with) reach it through ``sglang.benchmark``. No
dataset is ever loaded on the lab machine; the real wheel is not in the carry."""


def load_dataset(*args, **kwargs):
    raise RuntimeError("datasets is a stub on the lab GPU machine (no dataset downloads)")

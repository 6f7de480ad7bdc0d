"""Lab only: count the aten ops each process's main thread runs, by owner, for ``host_time_cpu.py --ops``.

Active only with ``LAB_OPCOUNT_DIR`` set (put this folder first on ``PYTHONPATH``): a torch dispatch mode entered
at interpreter start counts every non-view aten op, owned by the innermost frame of the plugin
(``sglang_replayssm/``, less its CPU runtime ``sglang_replayssm/cpu/``), the CPU runtime or SGLang (``sglang/``);
a daemon thread writes the counts to ``$LAB_OPCOUNT_DIR/ops-<pid>.json`` every half second.
"""

import os

if os.environ.get("LAB_OPCOUNT_DIR"):
    import collections
    import json
    import sys
    import threading
    import time

    from torch.utils._python_dispatch import TorchDispatchMode

    _counts: collections.Counter = collections.Counter()
    _NO_LAUNCH = {"empty.memory_format", "empty_strided.default", "lift_fresh.default"}

    def _owner() -> str:
        frame = sys._getframe(2)
        while frame is not None:
            path = frame.f_code.co_filename
            i = path.rfind("/sglang_replayssm/")
            if i >= 0:
                rel = path[i + 1:]
                if rel.startswith("sglang_replayssm/cpu/"):
                    return "runtime"
                return f"plugin {rel}:{frame.f_code.co_name}"
            if "/sglang/" in path:
                return "sglang"
            frame = frame.f_back
        return "other"

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            name = f"{func.overloadpacket.__name__}.{func._overloadname}"
            if not func.is_view and name not in _NO_LAUNCH:
                _counts[_owner()] += 1
            return func(*args, **(kwargs or {}))

    def _dump() -> None:
        path = os.path.join(os.environ["LAB_OPCOUNT_DIR"], f"ops-{os.getpid()}.json")
        while True:
            time.sleep(0.5)
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(dict(_counts), f)
            os.replace(tmp, path)

    _Count().__enter__()
    threading.Thread(target=_dump, daemon=True).start()

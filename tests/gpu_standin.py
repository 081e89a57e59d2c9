"""Stand-in jobs for the GPU workers' tests (``tests/scale_out/test_gpu_workers.py``): no torch, no training.

Imported in a worker process when its first job arrives, so ``SEEN_AT_IMPORT`` is the
``CUDA_VISIBLE_DEVICES`` the worker had when a job's code (torch, in a real run) was first imported.
``oom_on`` raises a fake ``torch.cuda.OutOfMemoryError``: a stand-in ``torch`` module with that class is
put in the worker's ``sys.modules`` (a real import costs seconds per worker), which is where
``runners.executors.gpu_workers`` looks for it.
"""

from __future__ import annotations

import os
import sys
import time
import types

SEEN_AT_IMPORT = os.environ.get("CUDA_VISIBLE_DEVICES")


class OutOfMemoryError(RuntimeError):
    pass


def record(i: int, pause: float = 0.0) -> dict:
    """Which worker ran job ``i`` and which device it saw, then and at import."""
    time.sleep(pause)
    return {
        "i": i,
        "pid": os.getpid(),
        "at_import": SEEN_AT_IMPORT,
        "now": os.environ["CUDA_VISIBLE_DEVICES"],
    }


def oom_on(i: int, device: str, pause: float = 0.0) -> dict:
    """:func:`record`, but a fake device out-of-memory error on the worker pinned to ``device``."""
    if os.environ["CUDA_VISIBLE_DEVICES"] == device:
        fake = sys.modules.setdefault("torch", types.ModuleType("torch"))
        fake.cuda = types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError, empty_cache=lambda: None)  # type: ignore[attr-defined]
        fake.set_num_threads = lambda n: None  # type: ignore[attr-defined]
        raise OutOfMemoryError(f"CUDA out of memory (job {i})")
    return record(i, pause)


def cuda_probe(i: int) -> dict:
    """What a real GPU worker sees: how many devices, and the one it trains on (``tests/scale_out/test_gpu.py``)."""
    import torch

    x = torch.ones(1024, device="cuda")
    props = torch.cuda.get_device_properties(0)
    return {**record(i), "count": torch.cuda.device_count(), "uuid": str(props.uuid), "sum": float(x.sum())}


def allocate(gib: float) -> None:
    """Ask for ``gib`` GiB of device memory at once (more than the GPU has: a real out-of-memory error)."""
    import torch

    torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")

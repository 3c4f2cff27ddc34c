"""Keep a CPU training step's freed activations from staying resident: glibc's mmap threshold.

PyTorch's CPU tensors come from the C library's ``malloc``. glibc serves a request of at least
``M_MMAP_THRESHOLD`` bytes with its own ``mmap`` (returned to the kernel by ``free``) and anything smaller
from its heaps (arenas), which give memory back only from their top. By default the threshold is
*dynamic*: it starts at 128 KiB and, each time an mmapped block is freed, rises to that block's size
(up to 32 MiB on 64-bit). A training step frees many multi-MiB activations, so after the first few the
threshold sits at 32 MiB and every later activation up to that size lands in a heap. The heaps then
fragment: freed blocks between live ones cannot be returned, and the process's resident memory (what
the OS sees, what kills a job) stays far above what tensors actually hold.

Measured with ``benchmarks/perf/logprob_memory.py`` (SmolLM2-135M, 8 rows × 512 tokens, chunked logprobs +
gradient checkpointing, one forward and backward, 2 threads): peak RSS 4.17 GB with glibc's dynamic
threshold, 1.94 GB with a fixed 128 KiB threshold (full logits: 10.02 and 8.86 GB). The price is time:
the step took 35-41 s instead of 30 s (every large block is a fresh mapping whose pages fault in;
thresholds of 1 and 8 MiB measured the same, 37-38 s and 1.95-2.08 GB). Set
``--memory.malloc-mmap-threshold-kb 0`` in either trainer to trade the memory back for that time: at lab-tiny's
size (0.9M parameters) the fixed threshold doubles an SFT step (``benchmarks/perf/allocator_ab.py``), so the lab
recipes set 0. The setting is process-wide; a trainer with 0 in a process where an earlier one fixed the threshold
calls `release_malloc_mmap_threshold` (32 MiB, where glibc's dynamic threshold settles).

`set_malloc_mmap_threshold` fixes the threshold with ``mallopt(M_MMAP_THRESHOLD, n)`` (which also
switches off the dynamic adjustment; glibc ``mallopt(3)``), the same as starting Python with the
environment variable ``MALLOC_MMAP_THRESHOLD_=n``. It affects blocks allocated afterwards. On a C library
other than glibc it does nothing and returns False.
"""

from __future__ import annotations

import ctypes
import platform

__all__ = ["release_malloc_mmap_threshold", "set_malloc_mmap_threshold"]

_M_MMAP_THRESHOLD = -3  # glibc <malloc.h>
_MAX_MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's HEAP_MAX / DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
_fixed = False  # whether this process has fixed the threshold (mallopt cannot give the dynamic one back)


def set_malloc_mmap_threshold(threshold_bytes: int) -> bool:
    """Fix glibc's mmap threshold at ``threshold_bytes`` for the rest of the process.

    Args:
        threshold_bytes: allocations of at least this many bytes get their own ``mmap`` and go back to
            the OS when freed; in ``[1, 33554432]`` (32 MiB, glibc's maximum). 131072 (128 KiB, glibc's
            initial value) is what the trainers use.

    Returns:
        True when glibc accepted the setting, False when the C library is not glibc (nothing changed).

    Raises:
        ValueError: ``threshold_bytes`` is outside ``[1, 33554432]``.
    """
    if isinstance(threshold_bytes, bool) or not 1 <= int(threshold_bytes) <= _MAX_MMAP_THRESHOLD:
        raise ValueError(f"threshold_bytes must be in [1, {_MAX_MMAP_THRESHOLD}], got {threshold_bytes!r}")
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)  # the C library already loaded into this process
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    accepted = bool(mallopt(_M_MMAP_THRESHOLD, int(threshold_bytes)))
    global _fixed
    _fixed = _fixed or accepted
    return accepted


def release_malloc_mmap_threshold() -> bool:
    """Undo `set_malloc_mmap_threshold` as far as glibc allows: once fixed, the dynamic threshold cannot come
    back, so set the value it settles at in a training process (32 MiB, its maximum: every block it would have
    served from the heaps goes to them again). Does nothing when this process never fixed the threshold (glibc's
    dynamic one still runs).

    Returns:
        True when the threshold was set to 32 MiB, False when nothing changed.
    """
    return _fixed and set_malloc_mmap_threshold(_MAX_MMAP_THRESHOLD)

"""`agents.training.allocator.set_malloc_mmap_threshold`: argument checks and its effect on resident memory."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from agents.training.allocator import set_malloc_mmap_threshold

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# Frees one 16 MiB block (glibc's dynamic threshold then rises to 16 MiB), allocates 64 blocks of 4 MiB
# with pages touched, frees every other one, and prints the resident set. Under the dynamic threshold
# the 4 MiB blocks live in a heap whose interior holes stay resident; under a fixed 128 KiB threshold
# each block is its own mapping and goes back to the OS on free.
_FRAGMENT = textwrap.dedent(
    """
    import sys
    import torch
    from agents.training.allocator import set_malloc_mmap_threshold

    if sys.argv[1] == "fixed":
        assert set_malloc_mmap_threshold(128 * 1024)
    big = torch.ones(4 * 1024 * 1024)  # 16 MiB, mmapped
    del big
    blocks = [torch.ones(1024 * 1024) for _ in range(64)]  # 64 x 4 MiB, pages touched
    del blocks[::2]
    with open("/proc/self/status") as f:
        rss_kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    print(rss_kib)
    """
)


def _rss_after_fragmenting(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _FRAGMENT, mode],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    return int(out.stdout.strip().splitlines()[-1]) * 1024


@pytest.mark.parametrize("bad", [0, -1, 32 * 1024 * 1024 + 1, True])
def test_rejects_thresholds_glibc_does_not_take(bad):
    with pytest.raises(ValueError, match="threshold_bytes"):
        set_malloc_mmap_threshold(bad)


@pytest.mark.skipif(not GLIBC, reason="mallopt(M_MMAP_THRESHOLD) is glibc's")
def test_fixed_threshold_returns_freed_blocks_to_the_os():
    dynamic = _rss_after_fragmenting("dynamic")
    fixed = _rss_after_fragmenting("fixed")
    # 32 freed blocks of 4 MiB = 128 MiB stay resident under the dynamic threshold only.
    assert dynamic - fixed > 96 * 1024 * 1024, (dynamic, fixed)


_RELEASE = textwrap.dedent(
    """
    from agents.training.allocator import release_malloc_mmap_threshold, set_malloc_mmap_threshold

    before = release_malloc_mmap_threshold()  # never fixed: glibc's dynamic threshold still runs, nothing to undo
    assert set_malloc_mmap_threshold(128 * 1024)
    print(before, release_malloc_mmap_threshold())
    """
)


@pytest.mark.skipif(not GLIBC, reason="mallopt(M_MMAP_THRESHOLD) is glibc's")
def test_release_acts_only_in_a_process_that_fixed_the_threshold():
    out = subprocess.run([sys.executable, "-c", _RELEASE], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]

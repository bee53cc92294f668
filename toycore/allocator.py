"""Keep freed memory for the next training step instead of handing it back to the system.

A training step allocates its temporaries (an n x m gradient, a batch of inputs: megabytes),
frees them, and allocates them again at the next step. glibc's malloc, by default, gives the
freed top of its heap back to the system once more than twice its adaptive mmap threshold lies
free there, so the next step's memory comes back as fresh pages, each zeroed by the kernel on
first touch: chapter 3's n = 64, m = 1024 shard took 2,000 page faults a step and spent about
40% of its time on them (6.4 against 3.5 ms a step on one thread).

``keep_freed_memory`` sets two glibc options for this process, once, at toycore's import:
blocks up to ``HEAP_BLOCKS`` come from the heap rather than from mmap (the most glibc allows,
the adaptive threshold's own ceiling), and a trim leaves ``KEPT_FREE`` of free heap in place.
Allocation changes no number: it decides where a tensor lives, not what is computed. Elsewhere
than glibc (macOS, musl) nothing is set, nor where ``$TOYCORE_KEEP_FREED_MEMORY`` is 0 (to
measure what the options save: ``benchmarks/allocator.py``).
"""

import ctypes
import ctypes.util
import os
import platform

M_TOP_PAD = -2  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
HEAP_BLOCKS = 32 << 20  # bytes: glibc refuses a larger mmap threshold on 64-bit systems
KEPT_FREE = 64 << 20  # bytes: several steps' temporaries at the book's sizes


def keep_freed_memory():
    """Set the two options if this process runs on glibc; True if glibc accepted both."""
    if platform.libc_ver()[0] != "glibc" or os.environ.get("TOYCORE_KEEP_FREED_MEMORY") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
    except OSError:
        return False
    settings = ((M_MMAP_THRESHOLD, HEAP_BLOCKS), (M_TOP_PAD, KEPT_FREE))
    return all([libc.mallopt(option, value) == 1 for option, value in settings])

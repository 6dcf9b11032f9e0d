"""An emulator worker keeps the memory a call freed for the next call (glibc): a worker reading a
1 MB input per call gave the pages back after each call and faulted them in again for the next."""

from __future__ import annotations

import ctypes
import platform

import pytest

import fnmap

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc settings")


def freed_and_kept_mb(n_blocks: int) -> int:
    """Allocate and free ``n_blocks`` one-megabyte blocks; the megabytes glibc then keeps free on top of the heap."""
    import ctypes

    class MallInfo2(ctypes.Structure):  # made here: a ctypes class does not pickle to the worker
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                         "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = MallInfo2
    blocks = [bytearray(1 << 20) for _ in range(n_blocks)]
    del blocks
    return mallinfo2().keepcost >> 20


def test_an_emulator_worker_keeps_freed_megabytes_for_its_next_call():
    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("glibc before 2.33 has no mallinfo2")
    assert fnmap.map(freed_and_kept_mb, [8], backend="emulator", chunksize=1) == [8]

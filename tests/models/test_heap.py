"""models.heap.trim gives freed C-heap pages back to the OS (what keeps a long cascade run's RSS flat)."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from pathlib import Path

import pytest

from models import heap


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim and /proc are Linux's")
def test_trim_returns_freed_heap_pages_that_free_alone_keeps() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    # 64 MB in 4 kB blocks (below the mmap threshold: they live in the heap), each touched so it is
    # resident; the last one stays allocated and pins the heap's top, so free() cannot shrink it.
    blocks = [libc.malloc(4096) for _ in range(16_384)]
    assert all(blocks)
    for b in blocks:
        libc.memset(b, 1, 4096)
    for b in blocks[:-1]:
        libc.free(b)
    before = _rss_kb()
    assert heap.trim()
    after = _rss_kb()
    libc.free(blocks[-1])
    assert before - after > 32_000, (before, after)  # most of the 64 MB is given back


_ARENAS = """
import ctypes, ctypes.util, os, re, sys, tempfile, threading
from models import heap

if sys.argv[1] == "tuned":
    assert heap.tune_for_server()
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]
libc.fclose.argtypes = [ctypes.c_void_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
go = threading.Barrier(12)

def work():  # twelve threads allocating: glibc hands each new one an arena, up to its limit
    go.wait()
    for _ in range(20_000):
        libc.free(libc.malloc(4096))

threads = [threading.Thread(target=work) for _ in range(12)]
for t in threads:
    t.start()
for t in threads:
    t.join()
path = tempfile.mktemp()
fp = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, fp)
libc.fclose(fp)
print(len(re.findall(r"<heap nr=", open(path).read())))
os.unlink(path)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt and malloc_info are Linux's")
def test_server_tuning_caps_the_heap_arenas() -> None:
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")}
    root = Path(__file__).resolve().parents[2]

    def arenas(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _ARENAS, mode], cwd=root, env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return int(out.stdout.strip())

    assert arenas("tuned") <= heap.ARENA_MAX
    assert arenas("default") > heap.ARENA_MAX  # the cap is what made the difference


def test_tuning_leaves_a_users_allocator_settings_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    assert heap.tune_for_server() is False

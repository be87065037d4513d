"""headcount's processes ask glibc to reuse freed blocks (headcount.common.env._reuse_heap_blocks), unless the user's
MALLOC_* settings say otherwise: checked in a fresh process through glibc's own report (malloc_info)."""

import re
import subprocess
import sys

import pytest

PROBE = """
import ctypes, os, tempfile
from headcount.common import env
env.release_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype = libc.fdopen.restype = ctypes.c_void_p
libc.malloc_info.argtypes = libc.fclose.argtypes = None
block = libc.malloc(8 << 20)  # 8 MiB: under the threshold asked for, so from the heap, not a mapping of its own
fd, path = tempfile.mkstemp()
stream = libc.fdopen(fd, b"w")
libc.malloc_info(0, ctypes.c_void_p(stream))
libc.fclose(ctypes.c_void_p(stream))
print(open(path).read())
os.unlink(path)
"""


def _mapped_bytes(env_vars: dict) -> int:
    import os

    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env={**os.environ, **env_vars}, check=True)
    found = re.search(r'<total type="mmap" count="(\d+)" size="(\d+)"/>', done.stdout)
    assert found, done.stdout[-500:]
    return int(found.group(2))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_blocks_of_a_few_mib_come_from_the_heap_unless_the_user_set_malloc_thresholds():
    assert _mapped_bytes({}) < 8 << 20
    assert _mapped_bytes({"MALLOC_MMAP_THRESHOLD_": "131072"}) >= 8 << 20

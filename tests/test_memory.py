import subprocess
import sys

import pytest

# Run in a fresh interpreter: the allocation history of a long test session makes heap reuse patterns
# unpredictable there, while a training process allocates the same sizes step after step.
_PROBE = """
import resource, torch
from neutronorch.train.resources import keep_freed_memory
applied = keep_freed_memory()
faults = []
for _ in range(30):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB, touched
    del block
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(applied, max(faults[-4:]))
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc tuning")
def test_freed_blocks_are_reused_without_page_faults():
    applied, faults = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                                     check=True).stdout.split()
    assert applied == "True"
    # System malloc maps a fresh region each time and faults in all 16,384 pages; reused heap pages
    # fault in none. The first few rounds may still fault while libraries torch loads on first use map
    # their pages next to the heap (up to about 10 rounds seen): the steady state is what is checked.
    assert int(faults) < 1000


def test_the_process_memory_readers_parse_proc(tmp_path):
    from neutronorch.features.memory import PAGE_BYTES, mapped_file_bytes, process_anonymous_bytes

    statm = tmp_path / "statm"
    statm.write_text("900000 5000 1200 100 0 4000 0\n")  # size resident shared text lib data dt, in pages
    assert process_anonymous_bytes(str(statm)) == (5000 - 1200) * PAGE_BYTES
    assert process_anonymous_bytes(str(tmp_path / "missing")) is None
    smaps = tmp_path / "smaps"
    smaps.write_text(
        "7f0000000000-7f0000100000 r-xp 00000000 08:01 1234                       /usr/lib/libtorch_cpu.so\n"
        "Size:               1024 kB\nRss:                 300 kB\nPss:                 300 kB\nVmFlags: rd ex\n"
        "7f0000100000-7f0000200000 rw-p 00000000 00:00 0 \n"
        "Rss:                 900 kB\n"
        "7f0000200000-7f0000300000 r--s 00000000 08:01 99                         /data/g/features.npy\n"
        "Rss:                 700 kB\n"
        "7f0000300000-7f0000400000 r--s 00000000 08:01 98                         /data/g/.cold (deleted)\n"
        "Rss:                  50 kB\n"
        "7f0000400000-7f0000500000 r--p 00000000 00:00 0                          [heap]\n"
        "Rss:                  60 kB\n")
    # Anonymous mappings and [heap] are not files; the excluded paths are left out.
    assert mapped_file_bytes(("/data/g/features.npy",), str(smaps)) == (300 + 50) * 1024
    assert mapped_file_bytes(("/data/g/",), str(smaps)) == 300 * 1024
    assert mapped_file_bytes((), str(smaps)) == (300 + 700 + 50) * 1024
    assert mapped_file_bytes((), str(tmp_path / "missing")) is None
    assert process_anonymous_bytes() > 0 and mapped_file_bytes() > 0  # this process's own


def test_a_releasable_array_is_anonymous_memory_that_can_be_handed_back():
    # The host cache's table: counted as the process's anonymous memory (which a memory cgroup's room and the
    # cache's shrinking go by), and its pages freed when a shrink hands them back.
    import mmap

    from neutronorch.features.memory import process_anonymous_bytes, releasable_array

    MiB = 1 << 20
    before = process_anonymous_bytes()
    buffer, table = releasable_array((64, MiB // 4), "float32")
    table[:] = 1.0
    grown = process_anonymous_bytes()
    assert grown - before > 60 * MiB
    buffer.madvise(mmap.MADV_DONTNEED, 32 * MiB, 32 * MiB)
    assert grown - process_anonymous_bytes() > 30 * MiB
    assert table[:32].min() == 1.0 and table[32:].max() == 0.0  # the handed-back pages read as zeros
    assert releasable_array((0, 5), "float16")[0] is None

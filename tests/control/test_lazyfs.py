"""The power-loss file system: what was fsynced survives killing it, what was not is gone.

The page-cache logic is held to a model (Hypothesis) without FUSE; the real
mount is then exercised as a node's daemon in a network namespace, the way
the power-loss nemesis uses it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from faultline.control import lazyfs
from faultline.control.lazyfs import PAGE, PageCache
from faultline.control.wait import wait_until

FILES = ["a", "b"]

op = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(FILES), st.integers(0, 3 * PAGE),
              st.binary(min_size=1, max_size=PAGE + 100)),
    st.tuples(st.just("truncate"), st.sampled_from(FILES), st.integers(0, 3 * PAGE)),
    st.tuples(st.just("fsync"), st.sampled_from(FILES)),
)


def apply(content: bytearray, step) -> None:
    if step[0] == "write":
        _, _, offset, data = step
        if offset > len(content):
            content.extend(bytes(offset - len(content)))
        content[offset:offset + len(data)] = data
    elif step[0] == "truncate":
        length = step[2]
        del content[length:]
        content.extend(bytes(length - len(content)))


@settings(max_examples=150, deadline=None)
@given(initial=st.binary(max_size=3 * PAGE), steps=st.lists(op, max_size=25))
# A shrink then a growth without fsync: the disk's old bytes must not show through the gap.
@example(initial=b"x" * (2 * PAGE + 10), steps=[("truncate", "a", 10), ("truncate", "a", 2 * PAGE + 10)])
@example(initial=b"x" * (2 * PAGE + 10), steps=[("truncate", "a", 10), ("write", "a", 2 * PAGE, b"y"),
                                               ("fsync", "a")])
def test_reads_see_every_write_and_a_crash_keeps_exactly_what_was_fsynced(tmp_path_factory, initial, steps):
    root = tmp_path_factory.mktemp("disk")
    current, durable = {}, {}
    for name in FILES:
        (root / name).write_bytes(initial)
        current[name], durable[name] = bytearray(initial), bytes(initial)
    fs = PageCache(root)
    for step in steps:
        name = step[1]
        if step[0] == "write":
            assert fs.write("/" + name, step[3], step[2]) == len(step[3])
        elif step[0] == "truncate":
            fs.truncate("/" + name, step[2])
        else:
            fs.fsync("/" + name)
            durable[name] = bytes(current[name])
        apply(current[name], step)
        seen_size = fs.size("/" + name)
        assert (seen_size if seen_size is not None else len(durable[name])) == len(current[name])
        assert fs.read("/" + name, len(current[name]) + 10, 0) == bytes(current[name])
    # The crash: the page cache is gone; a new mount sees only the disk.
    for name in FILES:
        assert (root / name).read_bytes() == durable[name], name
        assert PageCache(root).read("/" + name, 10 * PAGE, 0) == durable[name]


def test_a_renamed_file_keeps_its_unsynced_pages_under_the_new_name(tmp_path):
    (tmp_path / "old").write_bytes(b"")
    fs = PageCache(tmp_path)
    fs.write("/old", b"unsynced", 0)
    fs.rename("/old", "/new")
    assert fs.read("/new", 100, 0) == b"unsynced"
    fs.fsync("/new")
    assert (tmp_path / "new").read_bytes() == b"unsynced"
    assert not (tmp_path / "old").exists()


WRITER = textwrap.dedent("""
    import os, sys
    root = sys.argv[1]
    os.makedirs(os.path.join(root, "log"), exist_ok=True)
    with open(os.path.join(root, "log", "synced"), "wb") as f:
        f.write(b"kept " * 1000)
        f.flush()
        os.fsync(f.fileno())
        f.write(b"lost " * 1000)  # after the fsync: only in the page cache
    with open(os.path.join(root, "unsynced"), "wb") as f:
        f.write(b"never fsynced")
    with open(os.path.join(root, "unsynced")) as f:
        assert f.read() == "never fsynced"
    print("written")
""")

needs_fuse = pytest.mark.skipif(not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
                                reason="needs /dev/fuse and fuse3 (scripts/setup installs it)")


@needs_fuse
def test_a_node_loses_its_unsynced_writes_when_its_file_system_process_dies(make_cluster, tmp_path):
    cluster = make_cluster(("n1",))
    remote = cluster.remotes["n1"]
    disk, data = remote.home / "disk", remote.home / "data"
    disk.mkdir()
    data.mkdir()

    def mount() -> None:
        remote.spawn("disk", [sys.executable, "-m", "faultline.control.lazyfs", str(disk), str(data)],
                     remote.home / "disk.log", host_mounts=True)
        wait_until(lambda: str(data) in lazyfs.mounts(), 20, f"{data} was not mounted: see {remote.home}/disk.log")

    mount()
    # Written by a process of the node, as its broker would (its own `ip netns exec`).
    assert remote.run([sys.executable, "-c", WRITER, str(data)]).stdout.strip() == "written"
    assert (data / "log" / "synced").stat().st_size == 10000
    assert (disk / "log" / "synced").read_bytes() == b"kept " * 1000  # the fsynced part only

    remote.kill("disk")  # the power loss
    assert lazyfs.unmount(data)
    assert str(data) not in lazyfs.mounts()
    mount()
    assert (data / "log" / "synced").read_bytes() == b"kept " * 1000
    assert (data / "unsynced").read_bytes() == b""  # its name was durable, its data not
    # The nemesis's own teardown path: destroying the cluster unmounts what is left.
    cluster.destroy()
    assert lazyfs.mounts_under(tmp_path) == []


@needs_fuse
def test_lazyfs_refuses_a_mount_point_that_is_not_a_directory(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "faultline.control.lazyfs", str(tmp_path), str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "mount point" in proc.stderr and "create it first" in proc.stderr

"""A FUSE file system that loses what was written but not fsynced, for the power-loss nemesis.

In: a durable directory (what a disk holds) and a mount point. Out: the
durable directory mounted at the mount point, with a page cache of its own:
file data written through the mount is kept in this process's memory, in
4 KiB pages, until the file is fsynced; only then does it reach the durable
directory (written and fsynced there). Killing this process is a power loss
of the node: the mount is gone (unmount it with `unmount`) and the durable
directory holds exactly what was fsynced. Mounting it again is the restart.

Names are durable at once: creating, renaming and removing files and
directories go straight to the durable directory, as on a file system that
journals metadata but not data (ext4's data=ordered after the journal
commit). So a file created and written but never fsynced comes back empty,
and a truncation not followed by fsync is lost with the data.

Run it as `python -m faultline.control.lazyfs DURABLE MOUNT`; it stays in the
foreground until unmounted or killed. The mount's source is `faultline-lazyfs`
(see `mounts()`), which `faultline cleanup` looks for.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

PAGE = 4096
FSNAME = "faultline-lazyfs"

log = logging.getLogger("faultline.lazyfs")


@dataclass
class Cached:
    """The unsynced state of one file: its size as seen through the mount, the pages written since the
    last fsync, and how much of the durable file still shows through (a truncation hides the rest)."""

    size: int
    durable_limit: int
    pages: dict[int, bytearray] = field(default_factory=dict)


class PageCache:
    """The file system's logic, without FUSE: file operations on paths relative to `root`.

    Everything here runs on the one FUSE thread (the mount is single-threaded), so no locks."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.cache: dict[str, Cached] = {}
        self.fds: dict[str, int] = {}

    # -- helpers

    def real(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def _fd(self, path: str) -> int:
        fd = self.fds.get(path)
        if fd is None:
            fd = self.fds[path] = os.open(self.real(path), os.O_RDWR)
        return fd

    def _forget(self, path: str) -> None:
        self.cache.pop(path, None)
        fd = self.fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def _cached(self, path: str) -> Cached:
        entry = self.cache.get(path)
        if entry is None:
            size = os.fstat(self._fd(path)).st_size
            entry = self.cache[path] = Cached(size=size, durable_limit=size)
        return entry

    def _durable_bytes(self, path: str, entry: Cached, start: int, length: int) -> bytes:
        """Bytes [start, start+length) as the durable file shows them through the mount: zeros beyond
        what a truncation left visible."""
        end = min(start + length, entry.durable_limit)
        data = os.pread(self._fd(path), max(0, end - start), start) if end > start else b""
        return data + bytes(length - len(data))

    def _page(self, path: str, entry: Cached, index: int) -> bytearray:
        page = entry.pages.get(index)
        if page is None:
            page = entry.pages[index] = bytearray(self._durable_bytes(path, entry, index * PAGE, PAGE))
        return page

    # -- data

    def size(self, path: str) -> int | None:
        """The size seen through the mount, or None when nothing is cached (the durable size holds)."""
        entry = self.cache.get(path)
        return entry.size if entry is not None else None

    def read(self, path: str, length: int, offset: int) -> bytes:
        entry = self.cache.get(path)
        if entry is None:
            return os.pread(self._fd(path), length, offset)
        end = min(offset + length, entry.size)
        out = bytearray()
        pos = offset
        while pos < end:
            index, within = divmod(pos, PAGE)
            take = min(PAGE - within, end - pos)
            page = entry.pages.get(index)
            if page is not None:
                out += page[within:within + take]
            else:
                out += self._durable_bytes(path, entry, pos, take)
            pos += take
        return bytes(out)

    def write(self, path: str, data: bytes, offset: int) -> int:
        entry = self._cached(path)
        pos, view = offset, memoryview(data)
        while view:
            index, within = divmod(pos, PAGE)
            take = min(PAGE - within, len(view))
            self._page(path, entry, index)[within:within + take] = view[:take]
            view = view[take:]
            pos += take
        entry.size = max(entry.size, offset + len(data))
        return len(data)

    def truncate(self, path: str, length: int) -> None:
        entry = self._cached(path)
        if length < entry.size:
            last = (length + PAGE - 1) // PAGE  # pages from here on lie wholly beyond the new end
            for index in [i for i in entry.pages if i >= last]:
                del entry.pages[index]
            if length % PAGE:
                page = self._page(path, entry, length // PAGE)
                page[length % PAGE:] = bytes(PAGE - length % PAGE)
            entry.durable_limit = min(entry.durable_limit, length)
        entry.size = length

    def fsync(self, path: str) -> None:
        """Write the file's cached pages to the durable file and fsync it there."""
        entry = self.cache.pop(path, None)
        fd = self.fds.get(path)
        if entry is not None:
            fd = self._fd(path)
            os.ftruncate(fd, entry.durable_limit)
            os.ftruncate(fd, entry.size)
            for index, page in sorted(entry.pages.items()):
                start = index * PAGE
                if start < entry.size:
                    os.pwrite(fd, bytes(page[:entry.size - start]), start)
        if fd is not None:
            os.fsync(fd)

    # -- names (durable at once)

    def create(self, path: str, mode: int) -> None:
        fd = os.open(self.real(path), os.O_RDWR | os.O_CREAT, mode)
        old = self.fds.pop(path, None)
        if old is not None:
            os.close(old)
        self.fds[path] = fd

    def unlink(self, path: str) -> None:
        os.unlink(self.real(path))
        self._forget(path)

    def rename(self, old: str, new: str) -> None:
        os.rename(self.real(old), self.real(new))
        self._forget(new)
        for table in (self.cache, self.fds):
            if old in table:
                table[new] = table.pop(old)
        # A renamed directory takes the files under it along.
        prefix = old.rstrip("/") + "/"
        for table in (self.cache, self.fds):
            for key in [k for k in table if k.startswith(prefix)]:
                table[new.rstrip("/") + "/" + key[len(prefix):]] = table.pop(key)


def operations(root: Path):
    """The mfusepy Operations over a PageCache rooted at `root`."""
    import mfusepy

    class LazyOperations(mfusepy.Operations):
        use_ns = True

        def __init__(self):
            self.fs = PageCache(root)

        def _call(self, fn, *args):
            try:
                return fn(*args)
            except OSError as exc:
                raise mfusepy.FuseOSError(exc.errno or errno.EIO) from None

        def getattr(self, path, fh=None):
            st = self._call(os.lstat, self.fs.real(path))
            attrs = {key: getattr(st, key) for key in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size",
                                                       "st_ino", "st_dev", "st_blocks", "st_blksize")}
            attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
            size = self.fs.size(path)
            if size is not None:
                attrs["st_size"] = size
                attrs["st_blocks"] = (size + 511) // 512
            return attrs

        def readdir(self, path, fh):
            return [".", "..", *self._call(os.listdir, self.fs.real(path))]

        def statfs(self, path):
            st = os.statvfs(self.fs.real(path))
            return {key: getattr(st, key) for key in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                      "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

        def access(self, path, amode):
            if not os.access(self.fs.real(path), amode):
                raise mfusepy.FuseOSError(errno.EACCES)
            return 0

        def mkdir(self, path, mode):
            return self._call(os.mkdir, self.fs.real(path), mode)

        def rmdir(self, path):
            return self._call(os.rmdir, self.fs.real(path))

        def chmod(self, path, mode):
            return self._call(os.chmod, self.fs.real(path), mode)

        def chown(self, path, uid, gid):
            return self._call(os.chown, self.fs.real(path), uid, gid)

        def utimens(self, path, times=None):
            return self._call(os.utime, self.fs.real(path), None, ns=times) if times else \
                self._call(os.utime, self.fs.real(path))

        def unlink(self, path):
            return self._call(self.fs.unlink, path)

        def rename(self, old, new):
            return self._call(self.fs.rename, old, new)

        def create(self, path, mode, fi=None):
            self._call(self.fs.create, path, mode)
            return 0

        def open(self, path, flags):
            if not os.path.exists(self.fs.real(path)):
                raise mfusepy.FuseOSError(errno.ENOENT)
            if flags & os.O_TRUNC:
                self._call(self.fs.truncate, path, 0)
            return 0

        def read(self, path, size, offset, fh):
            return self._call(self.fs.read, path, size, offset)

        def write(self, path, data, offset, fh):
            return self._call(self.fs.write, path, bytes(data), offset)

        def truncate(self, path, length, fh=None):
            return self._call(self.fs.truncate, path, length)

        def fsync(self, path, datasync, fh):
            return self._call(self.fs.fsync, path)

        def fsyncdir(self, path, datasync, fh):
            return 0  # names are durable at once

        def flush(self, path, fh):
            return 0  # close() does not write back, as a real page cache does not

        def release(self, path, fh):
            return 0

    return LazyOperations()


# -- for the harness and `faultline cleanup`

def mounts(mounts_file: str = "/proc/self/mounts") -> list[str]:
    """Mount points of this file system that are mounted now (live or with a dead process behind)."""
    found = []
    with open(mounts_file) as f:
        for line in f:
            source, target, *_ = line.split()
            if source == FSNAME:
                found.append(target.replace("\\040", " "))
    return found


def mounts_under(directory: str | Path) -> list[str]:
    """Mounts of this file system at or below `directory` (a run's work folder, say)."""
    prefix = str(Path(directory).resolve()).rstrip("/") + "/"
    return [m for m in mounts() if (m.rstrip("/") + "/").startswith(prefix)]


def unmount(mount: str | Path) -> bool:
    """Detach the mount (lazily, so a dead file system process or an open file cannot block it);
    True if it was mounted."""
    mount = str(mount)
    if mount not in mounts():
        return False
    proc = subprocess.run(["umount", "-l", mount], capture_output=True, text=True)
    if proc.returncode != 0 and mount in mounts():
        raise OSError(f"cannot unmount {mount}: {proc.stderr.strip()}; try `umount -l {mount}` as root")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m faultline.control.lazyfs",
        description="Mount DURABLE at MOUNT, keeping written-but-not-fsynced data in this process's memory; "
                    "kill the process to lose it, as a power loss would. Stays in the foreground.")
    parser.add_argument("durable", help="the directory that holds what was fsynced (the node's disk)")
    parser.add_argument("mount", help="an empty directory to mount it on")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    durable, mount = Path(args.durable).resolve(), Path(args.mount).resolve()
    for path, what in ((durable, "durable directory"), (mount, "mount point")):
        if not path.is_dir():
            print(f"lazyfs: the {what} {path} is not a directory; create it first", file=sys.stderr)
            return 2
    if str(mount) in mounts():
        print(f"lazyfs: {mount} is already mounted; unmount it (`umount -l {mount}`) or run "
              f"`faultline cleanup`", file=sys.stderr)
        return 2
    import warnings

    import mfusepy

    warnings.simplefilter("ignore", DeprecationWarning)
    log.info("mounting %s at %s", durable, mount)
    mfusepy.FUSE(operations(durable), str(mount), foreground=True, nothreads=True, fsname=FSNAME)
    log.info("unmounted %s", mount)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What a page of memory the machine has not used lately costs to write.

    python3 benches/fresh_pages.py [MiB]      # 1024 by default

Under some hypervisors (this project's 2-core Firecracker VMs among them)
guest memory that stayed free for a few seconds is handed back to the host,
and the next write to it waits for the host to back it again. Every page a
broker appends to its CommitLog is such a page on a fresh machine: new page
cache. This prints, in the kernel's system time, what writing MiB through
the page cache costs when the pages are new (a new file), cached (the same
file again), freed a moment ago (a new file right after deleting the last),
and freed a while ago (after 5 s), and what the new case comes to per 1 KiB
message on each of a group's three nodes; then the same bytes written
around the page cache (O_DIRECT, from one reused buffer), in 1 MiB and in
128 KiB writes, with the wall time the device took.
"""
import mmap
import os
import sys
import tempfile
import time

CHUNK = 1 << 20


def write(path, mib, truncate):
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if truncate else 0)
    fd = os.open(path, flags, 0o600)
    buf = b"x" * CHUNK
    before = os.times()
    for i in range(mib):
        os.pwrite(fd, buf, i * CHUNK)
    after = os.times()
    os.close(fd)
    return (after.system - before.system) + (after.user - before.user)


def write_direct(path, mib, chunk):
    """O_DIRECT writes of `chunk` bytes from one page-aligned buffer; (CPU
    s, wall s), or None where the file system refuses O_DIRECT."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
    except OSError:
        return None
    buf = mmap.mmap(-1, chunk)
    buf.write(b"x" * chunk)
    try:
        before, t = os.times(), time.monotonic()
        for i in range(mib * CHUNK // chunk):
            os.pwrite(fd, buf, i * chunk)
        after, wall = os.times(), time.monotonic() - t
    except OSError:
        return None
    finally:
        os.close(fd)
        buf.close()
    return (after.system - before.system) + (after.user - before.user), wall


def main():
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    d = tempfile.mkdtemp(prefix="fresh-pages-", dir=os.environ.get("TMPDIR", "/tmp"))
    path = os.path.join(d, "f")
    rows = []
    try:
        rows.append(("new file", write(path, mib, True)))
        rows.append(("the same file again (cached)", write(path, mib, False)))
        os.unlink(path)
        rows.append(("new file, right after deleting one", write(path, mib, True)))
        os.unlink(path)
        time.sleep(5)
        rows.append(("new file, 5 s after deleting one", write(path, mib, True)))
        os.unlink(path)
        direct = [(f"O_DIRECT in {c >> 10} KiB writes", write_direct(path, mib, c)) for c in (CHUNK, 128 << 10)]
    finally:
        if os.path.exists(path):
            os.unlink(path)
        os.rmdir(d)
    pages = mib * CHUNK // 4096
    print(f"{'write of ' + str(mib) + ' MiB':40} {'CPU s':>7} {'s/GiB':>7} {'us/4KiB page':>13}")
    for name, s in rows:
        print(f"{name:40} {s:7.2f} {s * 1024 / mib:7.2f} {s * 1e6 / pages:13.2f}")
    for name, r in direct:
        if r is None:
            print(f"{name:40} (this file system refuses O_DIRECT)")
        else:
            cpu, wall = r
            print(f"{name:40} {cpu:7.2f} {cpu * 1024 / mib:7.2f} {cpu * 1e6 / pages:13.2f}   wall {wall:.2f} s")
    new, cached = rows[0][1], rows[1][1]
    per_msg = (new - cached) * 1e6 / (mib * 1024) * 3
    print(f"new pages cost {per_msg:.1f} us more per 1 KiB message over three nodes than cached ones")


if __name__ == "__main__":
    main()

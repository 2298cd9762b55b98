"""Runs on the node (python3, stdlib only, 3.6+): the remote half of cloudtrain's tar-delta sync.

cloudtrain runs it as `python3 -c "<this file>" OP DIR` with data on stdin; nothing is installed.
Paths are bytes end to end, so any file name the local file system allows survives.

    manifest DIR   stdin: NUL-separated paths relative to DIR
                   stdout: one NUL-terminated record per path, in order:
                   "f SIZE MTIME" regular file | "l TARGET" symlink | "d" directory | "o" other | "-" missing
    verify DIR     stdin: NUL-separated triples PATH, MTIME, SHA256 (hex)
                   stdout: per triple "=" when the node's file has that content (its mtime is then
                   set to MTIME so the next quick check passes), else "!"; NUL-terminated.
"""

import hashlib
import os
import stat
import sys


def manifest(root, names):
    for name in names:
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            yield b"-"
            continue
        if stat.S_ISREG(st.st_mode):
            yield b"f %d %d" % (st.st_size, int(st.st_mtime))
        elif stat.S_ISLNK(st.st_mode):
            yield b"l " + os.readlink(path)
        elif stat.S_ISDIR(st.st_mode):
            yield b"d"
        else:
            yield b"o"


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest().encode()


def verify(root, fields):
    for i in range(0, len(fields) - 2, 3):
        name, mtime, expected = fields[i], int(fields[i + 1]), fields[i + 2]
        path = os.path.join(root, name)
        try:
            same = sha256(path) == expected
            if same:
                os.utime(path, (mtime, mtime))
        except OSError:
            same = False
        yield b"=" if same else b"!"


def main():
    op, root = sys.argv[1], os.fsencode(sys.argv[2])
    fields = [f for f in sys.stdin.buffer.read().split(b"\0") if f]
    records = manifest(root, fields) if op == "manifest" else verify(root, fields)
    out = sys.stdout.buffer
    for record in records:
        out.write(record + b"\0")
    out.flush()


main()

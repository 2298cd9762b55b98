"""Runs on the node (python3, stdlib only, 3.6+): the remote half of cloudtrain's tar-delta sync,
and the node helper that carries a CLI invocation's commands over one SSH session.

cloudtrain runs it as `python3 -c "<this file>" OP DIR` with data on stdin; nothing is installed.
Paths are bytes end to end, so any file name the local file system allows survives.

    serve          the node helper (cloudtrain/remote/helper.py is the other half): reads framed
                   requests on stdin, runs each one's argv in turn (in a session of its own, its
                   input streamed in, its output streamed back framed), so a CLI's commands cost
                   one round trip each instead of a new SSH session each, and requests sent
                   together are answered together. It lives as long as its channel: at EOF it
                   exits at once and runs nothing it was sent after; the command it is running is
                   killed if its input had not all arrived (a cut input is never acted on), else
                   left to finish as under sshd (`runner.sh follow` sees its parent gone and
                   stops). Jobs are never its business: it only runs the commands it is sent
                   (runner.sh owns jobs).

    manifest DIR   stdin: NUL-separated paths relative to DIR
                   stdout: one NUL-terminated record per path, in order:
                   "f SIZE MTIME" regular file | "l TARGET" symlink | "d" directory | "o" other | "-" missing
    verify DIR     stdin: NUL-separated triples PATH, MTIME, SHA256 (hex)
                   stdout: per triple "=" when the node's file has that content (its mtime is then
                   set to MTIME so the next quick check passes), else "!"; NUL-terminated.
"""

import fcntl
import hashlib
import json
import os
import signal
import stat
import struct
import subprocess
import sys
import termios
import threading
import time


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


# ----------------------------------------------------------------------------- serve
# A frame is a 9-byte header (kind, request id, payload length) and the payload.
#   laptop -> node  R header (JSON: argv or op+root, timeout, home, after) | I input bytes | E end of input
#   node -> laptop  H hello (JSON: home, commands found on PATH) | O stdout | X stderr | C exit code
#                   | S skipped: a request whose `after` (earlier request ids) did not all exit 0 never
#                   runs; the laptop sent it before knowing they would (exec's start, sent with the
#                   checks that the node is ready and the workdir unchanged) and sends it again.
HEADER = struct.Struct(">cII")
CHUNK = 1 << 18
CUT = object()  # an input's end when the laptop is gone: never passed on as an end of input
# Input held for a command that has not read it yet; beyond this the reader stops reading the
# channel, so SSH's window holds the laptop back (a big upload into a slow disk stays bounded).
HELD_BYTES = 64 << 20
PROBED = ("python3", "rsync", "tar", "timeout", "find")


class Request(object):
    def __init__(self, rid, header):
        self.rid = rid
        self.argv = header.get("argv")
        self.op = header.get("op")  # manifest | verify, served in this process (no second interpreter)
        self.root = header.get("root")
        self.timeout = header.get("timeout")
        self.home = header.get("home")  # the home the laptop assumed (cached): refused if not ours
        self.after = header.get("after") or ()  # run only if these earlier requests exited 0
        self.expect = bool(header.get("expect"))  # manifest: input is name, expected record pairs
        self.input = []  # chunks, None at the end; guarded by `ready`
        self.held = 0
        self.closed = False  # the laptop is gone: nothing more will come, nothing waits for room
        self.complete = False  # all of its input arrived (its E frame)
        self.ready = threading.Condition()

    def put(self, chunk, force=False):
        with self.ready:
            while not force and not self.closed and self.held > HELD_BYTES:
                self.ready.wait()
            self.input.append(chunk)
            self.held += len(chunk) if isinstance(chunk, bytes) else 0
            self.ready.notify_all()

    def take(self):
        with self.ready:
            while not self.input:
                self.ready.wait()
            chunk = self.input.pop(0)
            self.held -= len(chunk) if isinstance(chunk, bytes) else 0
            self.ready.notify_all()
            return chunk


class Server(object):
    def __init__(self):
        self.out_lock = threading.Lock()
        self.queue = []  # requests in arrival order; None once the laptop is gone
        self.queue_ready = threading.Condition()
        self.requests = {}
        self.child = None
        self.current = None  # the request being run
        self.gone = False
        self.codes = {}  # request id -> exit code, for the `after` of later requests

    def send(self, kind, rid, data=b""):
        with self.out_lock:
            frame = HEADER.pack(kind, rid, len(data)) + data
            view = memoryview(frame)
            while view:
                view = view[os.write(1, view):]

    def read_exact(self, size):
        data = b""
        while len(data) < size:
            chunk = os.read(0, size - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def reader(self):
        try:
            while True:
                head = self.read_exact(HEADER.size)
                if head is None:
                    break
                kind, rid, size = HEADER.unpack(head)
                payload = self.read_exact(size) if size else b""
                if payload is None:
                    break
                if kind == b"R":
                    request = Request(rid, json.loads(payload.decode("utf-8")))
                    self.requests[rid] = request
                    with self.queue_ready:
                        self.queue.append(request)
                        self.queue_ready.notify()
                elif kind in (b"I", b"E") and rid in self.requests:
                    if kind == b"E":
                        self.requests[rid].complete = True
                    self.requests[rid].put(payload if kind == b"I" else None)
        finally:
            # The laptop is gone (channel closed, CLI ended or killed). A command whose input was
            # cut must not act on the part it got (`cat > f && mv f target`): killed before its
            # input is closed. Anything else finishes as under sshd; nothing queued runs.
            self.leave()

    def leave(self):
        self.gone = True
        running, child = self.current, self.child
        if running is not None and not running.complete and child is not None:
            # Its input was cut: what arrived is handed over (a tar extracts the files it got, so a
            # sync resumes), but no end of input ever comes; the feeder then kills it (a
            # `cat > f && mv f target` never publishes half a file).
            running.put(CUT, force=True)
            deadline = time.time() + 30
            while child.poll() is None and time.time() < deadline:
                time.sleep(0.05)
            self.end_child(signal.SIGKILL)
        os._exit(0)

    def end_child(self, sig=signal.SIGTERM):
        child = self.child
        if child is not None and child.poll() is None:
            try:
                os.killpg(child.pid, sig)
            except OSError:
                return

    def serve(self):
        # What runs for the laptop can tell whether the laptop is still there (runner.sh follow).
        os.environ["CLOUDTRAIN_ASKED_BY"] = str(os.getpid())
        commands = {}
        for name in PROBED:
            commands[name] = any(os.access(os.path.join(d, name), os.X_OK)
                                 for d in os.environ.get("PATH", "").split(os.pathsep) if d)
        self.home = os.environ.get("HOME") or os.getcwd()
        hello = {"home": self.home, "commands": commands}
        self.send(b"H", 0, json.dumps(hello).encode())
        threading.Thread(target=self.reader, daemon=True).start()
        while True:
            with self.queue_ready:
                while not self.queue:
                    self.queue_ready.wait()
                request = self.queue.pop(0)
            if request is None or self.gone:
                return
            if any(self.codes.get(rid) != 0 for rid in request.after):
                self.drain(request)
                del self.requests[request.rid]
                self.codes[request.rid] = None
                self.send(b"S", request.rid)
                continue
            self.current = request
            code = self.run(request)
            self.current = None
            del self.requests[request.rid]
            self.codes[request.rid] = code
            self.send(b"C", request.rid, str(code).encode())

    def run(self, request):
        if request.home is not None and request.home != self.home:
            # Its paths were built for another home: running it could write anywhere.
            self.drain(request)
            self.send(b"X", request.rid, ("cloudtrain: home is %s, not %s\n" % (self.home, request.home)).encode())
            return 125
        if request.op in ("manifest", "verify"):
            chunks = []
            while True:
                chunk = request.take()
                if chunk is None:
                    break
                chunks.append(chunk)
            fields = b"".join(chunks).split(b"\0")
            root = os.fsencode(request.root)
            if request.op == "manifest" and request.expect:
                # The laptop's expected record per name: exit 0 when the node has exactly that (the
                # workdir did not change), so requests sent `after` this one may run.
                names, expected = fields[0:-1:2], fields[1:-1:2]
                records = list(manifest(root, names))
                self.send(b"O", request.rid, b"".join(record + b"\0" for record in records))
                return 0 if records == expected else 1
            fields = [f for f in fields if f]
            records = manifest(root, fields) if request.op == "manifest" else verify(root, fields)
            self.send(b"O", request.rid, b"".join(record + b"\0" for record in records))
            return 0
        try:
            # A session of its own: a timeout or the laptop leaving ends the command and what it
            # started, by process group. (A job's supervisor calls setsid itself: never reached.)
            child = subprocess.Popen(request.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            self.drain(request)
            self.send(b"X", request.rid, ("%s: %s\n" % (request.argv[0], exc.strerror)).encode())
            return 127
        self.child = child
        timed_out = []
        timer = None
        if request.timeout:
            timer = threading.Timer(request.timeout, self.expire, (child, timed_out))
            timer.daemon = True
            timer.start()
        feeder = threading.Thread(target=self.feed, args=(request, child), daemon=True)
        errors = threading.Thread(target=self.pump, args=(child.stderr, b"X", request.rid), daemon=True)
        feeder.start()
        errors.start()
        self.pump(child.stdout, b"O", request.rid)
        code = child.wait()
        errors.join()
        feeder.join()
        if timer is not None:
            timer.cancel()
        self.child = None
        if timed_out:
            return 124  # as timeout(1) says it
        return code if code >= 0 else 128 - code

    def expire(self, child, timed_out):
        timed_out.append(True)
        try:
            os.killpg(child.pid, signal.SIGTERM)
        except OSError:
            return
        timer = threading.Timer(2.0, self.kill_group, (child,))
        timer.daemon = True
        timer.start()

    @staticmethod
    def kill_group(child):
        if child.poll() is None:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except OSError:
                return

    def feed(self, request, child):
        broken = False
        while True:
            chunk = request.take()
            if chunk is None:
                break
            if chunk is CUT:
                self.wait_consumed(child)
                self.kill_group(child)
                return
            if broken:
                continue  # the command stopped reading: drop the rest of its input
            try:
                child.stdin.write(chunk)
                child.stdin.flush()
            except OSError:
                broken = True
        try:
            child.stdin.close()
        except OSError:
            return

    @staticmethod
    def wait_consumed(child):
        """Until the command has read what is in its input pipe (or stopped reading), at most 10 s."""
        deadline = time.time() + 10
        while child.poll() is None and time.time() < deadline:
            try:
                waiting = struct.unpack("i", fcntl.ioctl(child.stdin.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
            except (OSError, ValueError):
                time.sleep(1.0)  # no way to look into the pipe: give it a moment
                return
            if waiting == 0:
                time.sleep(0.2)  # the last bytes it read are being written out
                return
            time.sleep(0.05)

    @staticmethod
    def drain(request):
        while request.take() is not None:
            continue

    def pump(self, stream, kind, rid):
        while True:
            chunk = stream.read1(CHUNK) if hasattr(stream, "read1") else os.read(stream.fileno(), CHUNK)
            if not chunk:
                return
            self.send(kind, rid, chunk)


def main():
    if sys.argv[1] == "serve":
        # SIGPIPE stays ignored (Python's default): a command that stops reading its input must
        # not end the helper; a closed channel shows as an OSError on write.
        server = Server()
        try:
            server.serve()
        except OSError:
            server.leave()  # the channel is gone (writing failed)
        return
    op, root = sys.argv[1], os.fsencode(sys.argv[2])
    fields = [f for f in sys.stdin.buffer.read().split(b"\0") if f]
    records = manifest(root, fields) if op == "manifest" else verify(root, fields)
    out = sys.stdout.buffer
    for record in records:
        out.write(record + b"\0")
    out.flush()


main()

#!/usr/bin/env python3
"""The server's work per lease renewal, counted in instructions (load-independent).

Starts the server named by REDIS_SERVER_BIN (default redis-server) under
`valgrind --tool=callgrind`, holds BATCH locks, and sends one watchdog batch
of renewals in each of these forms, as one pipeline:

  per-key   BATCH x EVALSHA extend.lua                 (before: one script call per lease)
  batch     1 x EVALSHA of the batch script             (now: one call per batch)
  set-ifeq  BATCH x SET <lock> <owner> IFEQ <owner> PX  (now, Valkey >= 8.1, no fencing)

each without fencing (the lock's value its owner alone) and with it (the
value `<owner> <granted us> <label>`, as a fenced grant of this version
writes it; the script is sent the same arguments either way, as renew.rs
sends them). The count of each form is zeroed before it
(`callgrind_control -z`) and read after it (`-d`); the median of ROUNDS runs,
divided by BATCH, is printed: instructions the server ran per renewal,
parsing and replying included. `hz` is set to 1 so that the server's cron
adds next to nothing to a window.

    python3 benches/renewal_cost.py            # redis-server
    REDIS_SERVER_BIN=.../valkey-server python3 benches/renewal_cost.py

The scripts are built as scripts.rs builds them (owner.lua first; the
batch: the bodies of extend.lua and extend_permit.lua wrapped, then
extend_batch.lua).
"""

import glob
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

BATCH = int(os.environ.get("BATCH", "512"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "..", "src", "store", "redis", "scripts")


def read(name):
    with open(os.path.join(SCRIPTS, name)) as f:
        return f.read()


OWNER = read("owner.lua")
EXTEND = OWNER + read("extend.lua")
BATCH_SRC = (
    OWNER + "local function extend_lock(KEYS, ARGV)\n" + read("extend.lua")
    + "\nend\nlocal function extend_permit(KEYS, ARGV)\n" + read("extend_permit.lua")
    + "\nend\n" + read("extend_batch.lua")
)


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.buf = b""

    def _line(self):
        while b"\r\n" not in self.buf:
            self.buf += self.s.recv(1 << 20)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind in (b"+", b"-", b":"):
            return line
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self.buf += self.s.recv(1 << 20)
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return data
        if kind == b"*":
            n = int(rest)
            return [self._reply() for _ in range(max(n, 0))]
        raise RuntimeError(line)

    def pipeline(self, cmds):
        self.s.sendall(b"".join(cmds))
        return [self._reply() for _ in cmds]

    def call(self, *args):
        return self.pipeline([resp(*args)])[0]


def main():
    server = os.environ.get("REDIS_SERVER_BIN", "redis-server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mkdtemp(prefix="renewal-cost-")
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p",
         server, "--port", str(port), "--save", "", "--appendonly", "no", "--hz", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                c = Conn(port)
                if c.call("PING") == b"+PONG":
                    break
            except OSError:
                time.sleep(0.1)
        info = c.call("INFO", "server").decode()
        field = lambda k: next((l.split(":", 1)[1].strip() for l in info.splitlines()
                                if l.startswith(k + ":")), None)
        make = field("server_name") or "redis"
        version = field(make + "_version")
        extend_sha = c.call("SCRIPT", "LOAD", EXTEND).decode()
        batch_sha = c.call("SCRIPT", "LOAD", BATCH_SRC).decode()
        owner = "o" * 26
        locks = [f"trl:{{paths:{i % 1024}}}:{i}:lock" for i in range(BATCH)]
        # A fenced grant of this version keeps its holder record in the
        # lock's value: `<owner> <granted us> <label>` (acquire.lua).
        plain = [resp("SET", k, owner, "PX", 600000) for k in locks]
        fenced_values = [resp("SET", k, owner + " 1700000000000000 label", "PX", 600000)
                         for k in locks]
        ifeq = make == "valkey" and tuple(map(int, version.split(".")[:2])) >= (8, 1)

        def forms(fenced):
            # A renewal is its key, owner and lease, fenced or not (renew.rs).
            per_key = [resp("EVALSHA", extend_sha, 1, k, owner, 30000) for k in locks]
            # The watchdog's batch: every lease the same, sent once.
            args = ["l" * len(locks), 30000] + [owner] * len(locks)
            batch = [resp("EVALSHA", batch_sha, len(locks), *locks, *args)]
            yield "per-key", per_key
            yield "batch", batch
            if ifeq and not fenced:
                yield "set-ifeq", [resp("SET", k, owner, "IFEQ", owner, "PX", 30000) for k in locks]

        def counted(cmds):
            subprocess.run(["callgrind_control", "-z", str(proc.pid)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            replies = c.pipeline(cmds)
            for f in glob.glob(f"{out}/cg.{proc.pid}*"):
                os.remove(f)
            subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            total = 0
            for f in glob.glob(f"{out}/cg.{proc.pid}*"):
                for line in open(f):
                    if line.startswith("summary:") or line.startswith("totals:"):
                        total = max(total, int(line.split()[1]))
            return total, replies

        print(f"{make} {version}: instructions per renewal, batch of {BATCH} "
              f"(median of {ROUNDS}; callgrind)")
        for fenced in (False, True):
            for name, cmds in forms(fenced):
                runs = []
                for _ in range(ROUNDS):
                    c.pipeline(fenced_values if fenced else plain)
                    total, replies = counted(cmds)
                    flat = replies[0] if name == "batch" else replies
                    ok = all(r in (b":1", b"+OK") for r in flat)
                    assert ok, (name, flat[:3])
                    runs.append(total)
                per = statistics.median(runs) / BATCH
                print(f"  fencing {str(fenced):5}  {name:9} {per:9.0f} Ir/renewal, "
                      f"{len(cmds)} command(s) sent")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    sys.exit(main())

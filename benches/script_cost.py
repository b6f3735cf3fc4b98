#!/usr/bin/env python3
"""Redis instructions per script call, for the costs a script's design
chooses between: an argument, a table reply, a closure, and the grant
script as shipped against the least grant that mints the same token.

    python3 benches/script_cost.py [calls] [release]

Starts `redis-server` (the PATH's) under `valgrind --tool=callgrind` on a
free port, loads each variant, and for each: runs `redis-benchmark -c 1
-r 100000000` with it (a fresh key per call: a grant's granted path),
zeroing the counts before (`callgrind_control -z`) and dumping them after
(`-d`). Prints `Ir` per call, the request's parsing and reply included.
Counts do not depend on the machine's load.

With `release`, the release's variants instead: each script first sets
the lock (`SET … PX`, the same in all), then releases it, so that the
owner check passes; the differences between rows are what the release's
parts cost.

Run it alone: `benches/cycle_cost.py` zeroes and dumps every callgrind'ed
process (`callgrind_control` without a pid), this one's server too.
"""

import glob
import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "src/store/redis/scripts")
OWNER = "0123456789abcdef0123456789abcdef"
LOCK = "trl:{cmp:1}:__rand_int__:lock"


def src(*names):
    return "".join(open(os.path.join(SCRIPTS, n)).read() for n in names)


def floor_grant():
    text = open(os.path.join(ROOT, "benches/compare/floor.rs")).read()
    return text.split('const GRANT: &str = r"')[1].split('";')[0]


CLOSURES = "\n".join(f"local function f{i}(a, b) return a or b end" for i in range(7))

VARIANTS = [
    ("return 1, 1 argument", "return 1", ["1", "k:__rand_int__", "a"]),
    ("return 1, 9 arguments", "return 1",
     ["1", "k:__rand_int__"] + list("abcdefghi")),
    ("return 1 after defining 7 functions", CLOSURES + "\nreturn 1",
     ["1", "k:__rand_int__", "a"]),
    ("return a 16-digit string", "return '1234567890123456'",
     ["1", "k:__rand_int__", "a"]),
    ("return {1, a 16-digit string}", "return {1, '1234567890123456'}",
     ["1", "k:__rand_int__", "a"]),
    ("the least grant (benches/compare/floor.rs)", None,
     ["2", "k:__rand_int__", "fence:b", OWNER, "30000", "86400000"]),
    # (As scripts.rs composes it: `migration!(6)` writes the prelude's
    # first line.)
    ("acquire.lua as shipped", src("token.lua", "owner.lua") + "local flags = ARGV[6]\n"
     + src("migration.lua", "acquire.lua"),
     ["1", LOCK, OWNER, "30000", "trl:{cmp:1}:fence", "86400000"]),
]


# The release's parts: each row sets the lock, then releases it.
SET_FIRST = "redis.call('SET', KEYS[1], ARGV[1], 'PX', 30000)\n"
OWNED = SET_FIRST + "if redis.call('GET', KEYS[1]) == ARGV[1] then\n"
DEL_LOCK = "\nreturn redis.call('DEL', KEYS[1]) end return 0"
RELEASE_VARIANTS = [
    ("SET alone (subtract from the rows below)", SET_FIRST + "return 1", ["1", LOCK, OWNER]),
    ("the least release (GET, compare, DEL)", OWNED + DEL_LOCK, ["1", LOCK, OWNER]),
    ("... and the mark's name made (string.sub, ..)",
     OWNED + "local w = string.sub(KEYS[1], 1, -5) .. 'waited'" + DEL_LOCK, ["1", LOCK, OWNER]),
    ("... and a string.find on an absent flags argument ('' )",
     OWNED + "local h = string.find(ARGV[2] or '', 'h', 1, true)" + DEL_LOCK, ["1", LOCK, OWNER]),
    ("... and the flags read only where sent",
     OWNED + "local f = ARGV[2] local h = f and string.find(f, 'h', 1, true)" + DEL_LOCK,
     ["1", LOCK, OWNER]),
    ("... and the mark deleted with the lock (DEL of 2 keys)",
     OWNED + "return redis.call('DEL', KEYS[1], 'trl:{cmp:1}:w') end return 0", ["1", LOCK, OWNER]),
    ("release.lua as shipped (owner.lua's function, the mark, the flags)",
     SET_FIRST + src("owner.lua", "release.lua"), ["1", LOCK, OWNER]),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    variants = RELEASE_VARIANTS if sys.argv[2:3] == ["release"] else VARIANTS
    port = str(free_port())
    out = tempfile.mkdtemp()
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p",
         "redis-server", "--port", port, "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def cli(*args):
        return subprocess.run(["redis-cli", "-p", port, *args],
                              capture_output=True, text=True).stdout.strip()

    try:
        for _ in range(300):
            if cli("PING") == "PONG":
                break
            time.sleep(0.1)
        print(f"Redis Ir per call (callgrind, {calls} calls each)")
        print("| call | Ir |")
        print("|---|---|")
        for name, body, args in variants:
            sha = cli("SCRIPT", "LOAD", body if body is not None else floor_grant())
            bench = ["redis-benchmark", "-p", port, "-c", "1", "-r", "100000000",
                     "EVALSHA", sha, *args]
            # Warm up, then measure from a clean keyspace.
            subprocess.run(bench[:3] + ["-n", "200"] + bench[3:], capture_output=True,
                           timeout=600)
            cli("FLUSHALL")
            subprocess.run(["callgrind_control", "-z", str(server.pid)], capture_output=True)
            run = subprocess.run(bench[:3] + ["-n", str(calls)] + bench[3:],
                                 capture_output=True, text=True, timeout=600)
            if f"{calls} requests completed" not in run.stdout + run.stderr:
                sys.exit(f"{name}: redis-benchmark did not complete its calls:\n"
                         f"{run.stdout[-500:]}{run.stderr[-500:]}")
            before = len(glob.glob(f"{out}/cg.{server.pid}.*"))
            subprocess.run(["callgrind_control", "-d", str(server.pid)], capture_output=True)
            # The new dump, once written to its end (its `totals:` line):
            # one read too early gave a figure of a part of the calls.
            ir = 0
            for _ in range(300):
                dumps = sorted(glob.glob(f"{out}/cg.{server.pid}.*"),
                               key=lambda p: int(p.rsplit(".", 1)[1]))
                if len(dumps) > before:
                    for line in open(dumps[-1]):
                        if line.startswith("totals:"):
                            ir = int(line.split()[1])
                if ir:
                    break
                time.sleep(0.1)
            print(f"| {name} | {ir / calls:,.0f} |", flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Instructions per lock cycle, of the client and of Redis, for each case of
the `compare` bench: a figure that does not depend on the machine's load.

    cargo bench -p tower-redis-lock-compare --bench compare --no-run
    python3 benches/cycle_cost.py [S1|S2|S4] [cycles] [case,case,...]

Runs `COMPARE_PROFILE=<scenario>:<case>` of the compare bench under
`valgrind --tool=callgrind`, its `redis-server`s too (through
`REDIS_SERVER_BIN`), and uses the bench's `COMPARE_MARK` handshake to zero
every count just before the measured cycles (`callgrind_control -z`) and
dump it just after (`-d`): warm-up, connection and script loads are left
out. Prints, per case, the client's and Redis' (summed over the servers)
instructions per cycle (`Ir`, user space: system calls are not counted).
With `CYCLE_COST_KEEP=<dir>`, each case's dumps are kept in `<dir>/<case>/`
for `callgrind_annotate`.
"""

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

# The server measured: `redis-server` on the PATH, or `$CYCLE_COST_SERVER`
# (e.g. a Valkey, whose binary keeps its symbols for `callgrind_annotate`).
SERVER = os.environ.get("CYCLE_COST_SERVER", "redis-server")

CASES = ["rslock", "ours", "ours-unfenced", "store-unfenced", "floor-fenced", "floor-unfenced",
         "floor-unfenced-os", "floor-unfenced-marked", "raw"]


def bench_binary(root):
    found = sorted(
        glob.glob(os.path.join(root, "target/release/deps/compare-*")),
        key=os.path.getmtime,
    )
    found = [f for f in found if os.access(f, os.X_OK) and not f.endswith(".d")]
    if not found:
        sys.exit("build it first: cargo bench -p tower-redis-lock-compare --bench compare --no-run")
    return found[-1]


def totals(path):
    """The `Ir` total and the command of one callgrind dump."""
    cmd, ir = "", 0
    with open(path) as f:
        for line in f:
            if line.startswith("cmd:"):
                cmd = line[4:].strip()
            elif line.startswith("totals:") or line.startswith("summary:"):
                ir = int(line.split()[1])
    return cmd, ir


def measure(binary, scenario, case, cycles, out):
    mark = os.path.join(out, "mark")
    wrapper = os.path.join(out, "redis-server")
    with open(wrapper, "w") as f:
        f.write(
            "#!/bin/sh\nexec valgrind --tool=callgrind "
            f"--callgrind-out-file={out}/server.%p {SERVER} \"$@\"\n"
        )
    os.chmod(wrapper, 0o755)
    env = dict(
        os.environ,
        COMPARE_PROFILE=f"{scenario}:{case}",
        COMPARE_CYCLES=str(cycles),
        COMPARE_MARK=mark,
        REDIS_SERVER_BIN=wrapper,
    )
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/client.%p",
         binary, "--bench"],
        cwd=os.path.dirname(os.path.abspath(__file__)) + "/compare",
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    for stage, action in (("before", "-z"), ("after", "-d")):
        while not (os.path.exists(mark) and open(mark).read() == stage):
            if proc.poll() is not None:
                sys.exit(f"{case}: the bench ended early")
            time.sleep(0.05)
        subprocess.run(["callgrind_control", action], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.remove(mark)
    proc.communicate(timeout=600)
    client = server = 0
    # Dumps made by `-d` are numbered (`<name>.<pid>.1`); the final dumps
    # at exit (not numbered) hold what came after the mark.
    for path in glob.glob(os.path.join(out, "*.*.1")):
        _, ir = totals(path)
        if os.path.basename(path).startswith("server."):
            server += ir
        else:
            client += ir
    keep = os.environ.get("CYCLE_COST_KEEP")
    if keep:
        dest = os.path.join(keep, case)
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        for path in glob.glob(os.path.join(out, "*.*.1")):
            shutil.copy(path, dest)
    return client / cycles, server / cycles


def main():
    scenario = sys.argv[1] if len(sys.argv) > 1 else "S1"
    cycles = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    binary = bench_binary(root)
    only = sys.argv[3].split(",") if len(sys.argv) > 3 else None
    cases = [c for c in CASES
             if (only is None or c in only) and not (scenario == "S4" and c in ("raw", "floor-unfenced", "floor-unfenced-os", "store-unfenced"))]
    print(f"{scenario}, {cycles} cycles per case (callgrind, Ir per cycle)")
    print("| case | client Ir/cycle | Redis Ir/cycle |")
    print("|---|---|---|")
    for case in cases:
        with tempfile.TemporaryDirectory() as out:
            client, server = measure(binary, scenario, case, cycles, out)
        print(f"| {case} | {client:,.0f} | {server:,.0f} |", flush=True)


if __name__ == "__main__":
    main()

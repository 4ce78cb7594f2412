"""Times whole runs of a command and the peak memory of its process tree.

    python3 benches/flink/measure.py RUNS -- COMMAND...

Prints one JSON line per run: wall seconds from start to exit, and the peak of the summed
resident memory of the command and every process under it (Flink's JVM is a child of the
Python driver, so /usr/bin/time's figure, the largest single process waited for, misses it),
sampled every 50 ms (a peak shorter than that may be missed). Then the medians of the runs.
Works for any command; BENCHMARKS.md runs it on Flink's jobs and on `vigil replay` alike.
"""

import json
import os
import statistics
import subprocess
import sys
import threading
import time


def tree_rss(root: int) -> int:
    """Resident bytes of `root` and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def run_once(command: list[str]) -> dict:
    started = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss(proc.pid))
            done.wait(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    out = proc.communicate()[0].decode()
    # Timed at the exit itself, not at the sampler's next tick.
    seconds = time.monotonic() - started
    done.set()
    sampler.join()
    if proc.returncode != 0:
        sys.exit(f"{command} exited with {proc.returncode}")
    return {"seconds": round(seconds, 3), "peak_tree_rss_mib": round(peak[0] / 1048576, 1), "stdout": out.strip()[-200:]}


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit("usage: measure.py RUNS -- COMMAND...")
    runs, command = int(sys.argv[1]), sys.argv[3:]
    results = [run_once(command) for _ in range(runs)]
    for r in results:
        print(json.dumps(r))
    print(json.dumps({
        "median_seconds": statistics.median(r["seconds"] for r in results),
        "seconds": [r["seconds"] for r in results],
        "median_peak_tree_rss_mib": statistics.median(r["peak_tree_rss_mib"] for r in results),
    }))


if __name__ == "__main__":
    main()

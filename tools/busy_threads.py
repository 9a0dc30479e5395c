"""Measure what the course's thread policy is for: small-op training on a machine with one core busy.

    .venv/bin/python tools/busy_threads.py

Starts a process that keeps one core busy, then times epochs of a small MLP trained on batches of
32 in fresh Pythons: OpenMP's default wait policy (idle threads spin) against
OMP_WAIT_POLICY=PASSIVE (idle threads sleep), with 1 and with all of torch's threads. Prints the
median epoch time of each; the figures in ``course_utils/threads.py`` come from this script.
"""

from __future__ import annotations

import os
import subprocess
import sys

CHILD = r"""
import statistics, sys, time, torch
torch.manual_seed(0)
torch.set_num_threads(int(sys.argv[1]))
m = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x, y = torch.randn(2048, 16), torch.randn(2048, 1)
def epoch():
    for i in range(0, 2048, 32):
        opt.zero_grad()
        ((m(x[i:i + 32]) - y[i:i + 32]) ** 2).mean().backward()
        opt.step()
epoch()
times = []
for _ in range(5):
    t = time.perf_counter(); epoch(); times.append(time.perf_counter() - t)
print(f"{statistics.median(times):.3f}")
"""


def epoch_seconds(threads: int, passive: bool) -> str:
    """Return the median epoch time printed by a fresh Python with the given settings."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    out = subprocess.run([sys.executable, "-c", CHILD, str(threads)], env=env,
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def main() -> None:
    """Print the four timings with one core kept busy."""
    import torch

    all_threads = torch.get_num_threads()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        print(f"one core kept busy by pid {busy.pid}; {os.cpu_count()} CPUs; median of 5 epochs")
        for passive in (False, True):
            for n in sorted({1, all_threads}):
                policy = "PASSIVE (sleep)" if passive else "default (spin)"
                print(f"  wait policy {policy:<16} threads {n}: {epoch_seconds(n, passive)} s per epoch")
    finally:
        busy.kill()
        busy.wait()


if __name__ == "__main__":
    main()

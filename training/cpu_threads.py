"""The torch thread count of a CPU training worker, chosen by timing steps while it trains (issue #26).

    chooser = ThreadChooser([1, torch.get_num_threads()])
    for step in ...:
        threads = chooser.threads_for(step)        # sets torch's intra-op threads for this step
        ... one optimizer step of `tokens` tokens in `seconds` ...
        chooser.record(threads, seconds, tokens)

Why. torch's CPU wheels run intra-op parallelism on OpenMP threads that spin while they wait for each other.
On an idle 2-core machine two threads train the 4-layer tiny policy ~1.7x faster than one; on the same
machine shared with other processes (load 4-9 on 2 cores) a descheduled thread leaves its partner spinning
at every op and two threads ran 5-10x SLOWER than one (measured side by side, docs/figures.md, #26).
OMP_WAIT_POLICY=PASSIVE would cure the spinning, but libgomp reads it once when torch loads, before any of
this code runs. So the worker keeps its thread count (Ray sets it to the worker's CPU reservation) and every
`every` steps times one step on each other candidate; a candidate that trains more than WIN x the tokens per
second of the current count's recent median takes over. Load that arrives between two probes shows as steps
suddenly >2x slower than that median: three in a row start a probe at once, measured against the slow steps
(the probe run of #26 went from 0.19 to 1.1 s a step within a minute when other jobs started).

What a switch costs: reproducibility. On the default's real shapes the thread count changes the order of
float sums (1 vs 2 threads: losses differ from the second step on, by 1e-7 at first, then as any two runs
of chaotic training do; docs/figures.md), so a run that switched trains another policy than one that did not.
Hence the first `warmup` steps are not timed (in a fresh Ray worker they ran at 1/3 - 1/2 of the steady speed,
and one 1-thread probe against them won spuriously on idle cores: make run's SFT then trained 200 steps on the
slower count and ended elsewhere), and a probe must win by WIN: on idle cores 2 threads stay, and only the
probes, at fixed steps, run on 1 thread, so runs repeat bit for bit. Under load they are faster, not
repeatable; a fixed `sft.cpu_threads` gives repeatable runs at any load, at the spinning threads' speed.
"""
from __future__ import annotations

import statistics
from collections import deque

import torch


class ThreadChooser:
    """Which torch thread count trains fastest now; re-checked every `every` steps as the machine's load changes."""

    SLOWER, RUN = 2.0, 3  # a step this many times the recent median, this many in a row, means the load changed
    WIN = 1.2  # a probe takes over only this much faster than the recent median: not on timing noise (idle: 1.5x slower)

    def __init__(self, candidates: list[int], every: int = 200, warmup: int = 3, window: int = 10):
        self.candidates = sorted(set(candidates))
        self.current = max(self.candidates)  # the worker's own count: the old behaviour until a probe beats it
        self.every = every
        self.first = warmup + window  # the first probe: once the window holds steady steps
        self.untimed = warmup  # steps left whose time is not recorded (allocator, lazy init, first batches)
        self.recent: deque[float] = deque(maxlen=window)  # seconds per token of the current count's last steps
        self.slow: list[float] = []  # the current run of steps > SLOWER x the recent median
        self.pending: list[int] = []
        self.probe_now = False

    def threads_for(self, step: int) -> int:
        """The thread count for `step` (set in torch): a probe of another candidate, or the current choice."""
        periodic = (step >= self.first and (step - self.first) % self.every == 0
                    and len(self.recent) == self.recent.maxlen)
        if (periodic or self.probe_now) and not self.pending:
            self.pending = [c for c in self.candidates if c != self.current]
            self.probe_now = False
        threads = self.pending[0] if self.pending else self.current
        torch.set_num_threads(threads)
        return threads

    def record(self, threads: int, seconds: float, tokens: int) -> None:
        """One step's time; a probe that clearly beats the current count's recent median switches to its count."""
        if self.untimed > 0:
            self.untimed -= 1
            return
        per_token = seconds / max(1, tokens)
        if threads == self.current:
            slow = len(self.recent) == self.recent.maxlen and per_token > self.SLOWER * statistics.median(self.recent)
            self.slow = self.slow + [per_token] if slow else []
            if len(self.slow) < self.RUN:
                self.recent.append(per_token)
                return
            self.recent = deque(self.slow, maxlen=self.recent.maxlen)  # the new regime is what a probe must beat
            self.slow, self.probe_now = [], True
            return
        self.pending.remove(threads)
        if per_token * self.WIN < statistics.median(self.recent):
            self.current = threads
            self.recent = deque([per_token], maxlen=self.recent.maxlen)

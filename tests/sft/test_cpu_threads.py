"""CPU thread choice (training/cpu_threads.py): the chooser follows the faster count, the thread count does not
change the training arithmetic, and the trainer restores the process's thread count when it returns."""
from __future__ import annotations

import torch

from training.cpu_threads import ThreadChooser
from training.sft_trainer import MetricsHistory, run_sft_worker


def drive(chooser: ThreadChooser, seconds_per_token, steps: int) -> list[int]:
    """Run `steps` simulated steps of 1,000 tokens; `seconds_per_token`: {threads: s} or (step, threads) -> s."""
    rate = seconds_per_token if callable(seconds_per_token) else lambda step, threads: seconds_per_token[threads]
    used = []
    for step in range(steps):
        threads = chooser.threads_for(step)
        chooser.record(threads, rate(step, threads) * 1000, 1000)
        used.append(threads)
    return used


def test_chooser_switches_to_the_faster_count_and_keeps_a_faster_own_count():
    before = torch.get_num_threads()
    try:
        loaded = drive(ThreadChooser([1, 2], every=5, first=3), {1: 1e-4, 2: 8e-4}, 12)
        # steps 0-2 on the worker's own 2 threads; step 3 probes 1 thread and wins; step 8 probes 2 again and loses
        assert loaded == [2, 2, 2, 1, 1, 1, 1, 1, 2, 1, 1, 1]
        idle = drive(ThreadChooser([1, 2], every=5, first=3), {1: 3e-4, 2: 2e-4}, 12)
        assert idle == [2, 2, 2, 1, 2, 2, 2, 2, 1, 2, 2, 2]  # one probe step per 5 on the slower count
    finally:
        torch.set_num_threads(before)


def test_load_arriving_between_probes_starts_a_probe_after_three_slow_steps():
    before = torch.get_num_threads()
    try:
        # idle until step 30, then other processes take the cores: 2 spinning threads 10x slower, 1 thread 1.5x
        rate = lambda step, threads: {1: 3e-4, 2: 2e-4}[threads] * (1 if step < 30 else {1: 1.5, 2: 10}[threads])
        used = drive(ThreadChooser([1, 2], every=200, first=3), rate, 40)
        assert used[4:30] == [2] * 26  # the periodic probe at step 3 lost to the idle 2 threads
        assert used[30:33] == [2, 2, 2] and used[33:] == [1] * 7  # three slow steps, a probe, and 1 thread from then on
    finally:
        torch.set_num_threads(before)


def test_thread_count_does_not_change_losses_and_is_restored(sft_cfg, tmp_path):
    before = torch.get_num_threads()
    losses = {}
    for threads in (1, 2):
        cfg = sft_cfg.model_copy(update={"cpu_threads": threads, "output_dir": str(tmp_path / f"t{threads}")})
        history = MetricsHistory()
        run_sft_worker(cfg, 0, 1, torch.device("cpu"), history)
        assert set(history.series("threads").values()) == {threads}
        losses[threads] = history.series("loss")
        assert torch.get_num_threads() == before
    # Exact equality: the tiny model's kernels give the same sums on 1 and 2 threads (checked at the 4-layer
    # default size too: equal losses over 12 interleaved steps, docs/figures.md #26).
    assert losses[1] == losses[2]

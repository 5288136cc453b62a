"""Denormal floats on CPU: SFT step speed of a TRAINED policy with and without flush-to-zero, side by side.

    .venv/bin/python bench/bench_denormal.py                    # the newest stages of AFM_HOME (make run); none: skips
    .venv/bin/python bench/bench_denormal.py --afm-home /tmp/afm-run --seconds 25 --rounds 2

Why: the default's SFT ran ~21.8k tokens/s at its start and ~15.8k by its last steps with the same work per
step. A trained policy's activations and gradients carry denormal numbers (the sharp softmaxes of trained
attention heads), and x86 cores compute with those on a slow path. `models.policy.load_policy` now turns on
`torch.set_flush_denormal(True)` for the process (`flush_denormals`).

What it runs: the pipeline's SFT trainer (`run_sft_worker`, the default recipe's step: max_len 1024, micro_batch
2 packed, 2 threads) from the SFT stage's final policy on the distill stage's trajectories, in fresh processes,
alternating flush off / on for `--rounds` rounds of `--seconds` each; tokens/s = the median over a round's steps
(its first 5 dropped). The ratio on / off is the line (target >= 1.15: the slowdown seen in the pipeline). The
untrained base policy is timed the same way as the control (it has few denormals: ratio ~1).

Appends JSON lines `{"bench","metric","value","target","unit","detail"}` to bench/results/denormal.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "denormal.jsonl"

# One timed round, run in a fresh process so the flag is set (or not) before torch's thread pool exists.
ROUND = """
import statistics, sys, tempfile, torch
from training.sft_trainer import MetricsHistory, SFTConfig, run_sft_worker
policy, data, seconds, flush = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4] == "1"
import models.policy
if not flush:  # load_policy turns flushing on; this round keeps the hardware default instead
    models.policy.flush_denormals = lambda: None
# constant: the rate the default's wsd has in a round this short (a time-budgeted wsd would decay within it)
cfg = SFTConfig(model_path=policy, dataset=data, dataset_file=data.rsplit("/", 1)[-1], max_len=1024, pack=True,
                micro_batch=2, lr=3e-3, schedule="constant", max_steps=4300, time_budget_s=seconds, cpu_threads=2,
                checkpoint_every=10**6, output_dir=tempfile.mkdtemp(), seed=0)
history = MetricsHistory()
run_sft_worker(cfg, 0, 1, torch.device("cpu"), history)
print(statistics.median(list(history.series("tokens_per_s").values())[5:]))
"""


def emit(metric: str, value: float, target: float | None, unit: str, detail: dict) -> None:
    line = {"bench": "denormal", "metric": metric, "value": round(value, 4), "target": target, "unit": unit,
            "detail": detail}
    print(json.dumps(line))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")


def newest(stages: Path, prefix: str, file: str) -> Path | None:
    found = sorted(stages.glob(f"{prefix}-*/{file}"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def tokens_per_s(policy: Path, data: Path, seconds: float, flush: bool) -> float:
    out = subprocess.run([sys.executable, "-c", ROUND, str(policy), str(data), str(seconds), "1" if flush else "0"],
                         cwd=ROOT, capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--afm-home", type=Path, default=Path(os.environ.get("AFM_HOME", ROOT / ".afm")),
                        help="AFM_HOME of a finished pipeline run (its SFT, policy and distill stages are used)")
    parser.add_argument("--seconds", type=float, default=25.0, help="training seconds per round")
    parser.add_argument("--rounds", type=int, default=2, help="off/on pairs per policy")
    args = parser.parse_args()
    stages = args.afm_home.resolve() / "artifacts" / "stages"
    found = [newest(stages, "distill", "train.jsonl"), newest(stages, "sft", "model.safetensors"),
             newest(stages, "policy", "model.safetensors")]
    if None in found:  # `make bench` on a machine that has not run the pipeline: say so, write no row
        print(f"bench_denormal: skipped, {stages} holds no finished pipeline run (distill, policy and sft stages); "
              "run `make run` first or pass --afm-home of one")
        return
    data, sft_model, base_model = found
    policies = {"trained": sft_model.parent, "untrained": base_model.parent}
    for label, policy in policies.items():
        off, on = [], []
        for _ in range(args.rounds):
            off.append(tokens_per_s(policy, data, args.seconds, flush=False))
            on.append(tokens_per_s(policy, data, args.seconds, flush=True))
        detail = {"policy": str(policy), "off_tokens_per_s": [round(x) for x in off],
                  "on_tokens_per_s": [round(x) for x in on], "seconds_per_round": args.seconds,
                  "load_1min": round(os.getloadavg()[0], 2)}
        emit(f"flush_denormal_speedup_{label}", statistics.median(on) / statistics.median(off),
             1.15 if label == "trained" else None, "x", detail)


if __name__ == "__main__":
    main()

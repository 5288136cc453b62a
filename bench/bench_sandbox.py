"""Sandbox throughput: programs/s of two earlier sandboxes and of the current one, side by side in one process,
on a trivial program and on a reward-like one (a HumanEval check program with the canonical solution, as the RL
reward and the evaluation run it). The earlier ones: `old`, the read-only host root (host workdir, rlimits
only), and `polled`, the current design before its exit was awaited on a pidfd and the editable install's .pth
was covered (Popen.wait polling, the finder imported at every start). Each round runs the three in turn (old,
polled, new) so machine load hits all alike: a ratio is the median of the per-round ratios, the rates are the
median rounds.
Appends JSON lines to bench/results/sandbox.jsonl:
    {"bench": "sandbox", "metric", "value", "target", "unit", "detail"}

The earlier implementations are loaded from git (<commit>:agents/tools/sandbox.py) into temporary modules.

Run:  .venv/bin/python bench/bench_sandbox.py [--rounds 5] [--programs 10]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.tools import sandbox as new_sandbox  # noqa: E402
from problems.humaneval import humaneval_check_program, humaneval_problems  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "sandbox.jsonl"
BASELINES = {"old": "eb63f3424ffc749e617b1d16fe5ade212ef3f402",  # last commit of the read-only-root sandbox
             "polled": "d86ae25b7f18d86bf3e8fa52970b4dd9c0438819"}  # last commit before the pidfd wait
# the minimal root may cost at most 20% of the old sandbox's reward throughput; the pidfd wait and the covered
# .pth are there for speed, so they must at least not be slower than the polled sandbox
TARGETS = {"old": 0.8, "polled": 1.0}


def emit(metric: str, value: float, target: float | None, unit: str, detail: dict) -> dict:
    row = {"bench": "sandbox", "metric": metric, "value": round(value, 3), "target": target, "unit": unit,
           "detail": detail}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))
    return row


def load_sandbox(name: str, commit: str, workdir: Path):
    source = subprocess.run(["git", "show", f"{commit}:agents/tools/sandbox.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = workdir / f"{name}_sandbox.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"{name}_sandbox", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"{name}_sandbox"] = module  # dataclasses look the module up while building SandboxResult
    spec.loader.exec_module(module)
    # PROJECT_ROOT derives from the file's location: point it (and the hidden paths) at the real checkout
    module.PROJECT_ROOT = ROOT
    return module


def rate(module, programs: list[str]) -> float:
    """Programs/s running `programs` one after the other (as the reward does); every one must pass."""
    limits = module.SandboxLimits(timeout_s=10, cpu_s=11)
    if hasattr(limits, "hidden_paths"):
        limits = limits.model_copy(update={"hidden_paths": [str(ROOT), "/root", str(Path.home())]})
    start = time.perf_counter()
    for code in programs:
        result = module.run_python(code, limits)
        assert result.status == "ok", (module.__name__, result.status, result.stderr[-300:])
    return len(programs) / (time.perf_counter() - start)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5, help="rounds of old, polled, new; the median counts")
    ap.add_argument("--programs", type=int, default=10, help="programs per round and implementation")
    args = ap.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-sandbox-"))
    sandboxes = {name: load_sandbox(name, commit, workdir) for name, commit in BASELINES.items()}
    sandboxes["new"] = new_sandbox
    problems = humaneval_problems()[: args.programs]
    workloads = {
        "trivial": ["print(1)"] * args.programs,
        "humaneval_check": [humaneval_check_program(p, p.metadata["canonical_solution"]) for p in problems],
    }
    probe = new_sandbox.run_python("x = bytearray(50 * 1024 * 1024)", new_sandbox.SandboxLimits(timeout_s=10))
    for name, programs in workloads.items():
        for module in sandboxes.values():
            rate(module, programs[:2])  # warm the page cache for each
        rounds = {impl: [] for impl in sandboxes}
        for _ in range(args.rounds):
            for impl, module in sandboxes.items():
                rounds[impl].append(rate(module, programs))
        medians = {impl: statistics.median(r) for impl, r in rounds.items()}
        detail = {"programs_per_round": len(programs), "rounds": args.rounds,
                  **{f"{impl}_rounds": [round(r, 2) for r in rounds[impl]] for impl in sandboxes},
                  **{f"{impl}_commit": commit[:10] for impl, commit in BASELINES.items()},
                  "cgroup": probe.cgroup, "cpus": os.cpu_count(), "load_avg_1min": round(os.getloadavg()[0], 2)}
        for impl in sandboxes:
            emit(f"programs_per_s_{impl}_{name}", medians[impl], None, "programs/s", detail)
        for base in BASELINES:
            paired = statistics.median(n / o for n, o in zip(rounds["new"], rounds[base]))
            emit(f"new_over_{base}_{name}", paired, TARGETS[base], "ratio",
                 {**detail, "ratio_of_medians": round(medians["new"] / medians[base], 3)})
    emit("peak_memory_50mib_program", (probe.peak_memory_bytes or 0) / 2**20, None, "MiB",
         {"status": probe.status, "cgroup": probe.cgroup,
          "note": "cgroup peak of the whole tree (bwrap, python, tmpfs pages) for a program holding 50 MiB"})


if __name__ == "__main__":
    main(sys.argv[1:])

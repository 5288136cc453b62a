"""Sandbox throughput: programs/s of the previous sandbox (read-only host root, host workdir, rlimits only) and
of the current one (minimal root, tmpfs workdir, cgroup per run), side by side in one process, on a trivial
program and on a reward-like one (a HumanEval check program with the canonical solution, as the RL reward and
the evaluation run it). Rounds alternate old/new so machine load hits both alike: the ratio is the median of the
per-round new/old ratios (each pair ran back to back), the rates are the median rounds.
Appends JSON lines to bench/results/sandbox.jsonl:
    {"bench": "sandbox", "metric", "value", "target", "unit", "detail"}

The previous implementation is loaded from git (OLD_COMMIT:agents/tools/sandbox.py) into a temporary module.

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
OLD_COMMIT = "eb63f3424ffc749e617b1d16fe5ade212ef3f402"  # last commit of the read-only-root sandbox
TARGET_RATIO = 0.8  # the new sandbox may cost at most 20% of the reward throughput


def emit(metric: str, value: float, target: float | None, unit: str, detail: dict) -> dict:
    row = {"bench": "sandbox", "metric": metric, "value": round(value, 3), "target": target, "unit": unit,
           "detail": detail}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))
    return row


def load_old_sandbox(workdir: Path):
    source = subprocess.run(["git", "show", f"{OLD_COMMIT}:agents/tools/sandbox.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = workdir / "old_sandbox.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_sandbox", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_sandbox"] = module  # dataclasses look the module up while building SandboxResult
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
    ap.add_argument("--rounds", type=int, default=5, help="alternating old/new rounds; the median counts")
    ap.add_argument("--programs", type=int, default=10, help="programs per round and implementation")
    args = ap.parse_args(argv)
    old_sandbox = load_old_sandbox(Path(tempfile.mkdtemp(prefix="bench-sandbox-")))
    problems = humaneval_problems()[: args.programs]
    workloads = {
        "trivial": ["print(1)"] * args.programs,
        "humaneval_check": [humaneval_check_program(p, p.metadata["canonical_solution"]) for p in problems],
    }
    probe = new_sandbox.run_python("x = bytearray(50 * 1024 * 1024)", new_sandbox.SandboxLimits(timeout_s=10))
    for name, programs in workloads.items():
        rate(old_sandbox, programs[:2]), rate(new_sandbox, programs[:2])  # warm the page cache for both
        rounds = {"old": [], "new": []}
        for _ in range(args.rounds):
            rounds["old"].append(rate(old_sandbox, programs))
            rounds["new"].append(rate(new_sandbox, programs))
        old, new = statistics.median(rounds["old"]), statistics.median(rounds["new"])
        paired = statistics.median(n / o for n, o in zip(rounds["new"], rounds["old"]))
        detail = {"ratio_of_medians": round(new / old, 3), "programs_per_round": len(programs), "rounds": args.rounds,
                  "old_rounds": [round(r, 2) for r in rounds["old"]], "new_rounds": [round(r, 2) for r in rounds["new"]],
                  "old_commit": OLD_COMMIT[:10], "cgroup": probe.cgroup, "cpus": os.cpu_count(),
                  "load_avg_1min": round(os.getloadavg()[0], 2)}
        emit(f"programs_per_s_old_{name}", old, None, "programs/s", detail)
        emit(f"programs_per_s_new_{name}", new, None, "programs/s", detail)
        emit(f"new_over_old_{name}", paired, TARGET_RATIO, "ratio", detail)
    emit("peak_memory_50mib_program", (probe.peak_memory_bytes or 0) / 2**20, None, "MiB",
         {"status": probe.status, "cgroup": probe.cgroup,
          "note": "cgroup peak of the whole tree (bwrap, python, tmpfs pages) for a program holding 50 MiB"})


if __name__ == "__main__":
    main(sys.argv[1:])

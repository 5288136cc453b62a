"""SFT data at scale: peak memory and time of the tokenize step (training/sft_rows.py, streamed into an Arrow
rows artifact) against the in-memory builder it replaced (every example a Python list, then packed).

    .venv/bin/python bench/bench_sft_rows.py                 # 20,000 trajectories, ~3 min on 2 cores
    .venv/bin/python bench/bench_sft_rows.py --n 2000        # a quick look

Each builder runs in a fresh process (`--case streamed|in_memory`), after a warm-up build on 50 trajectories;
the figures are its peak RSS and its peak anonymous RSS (without the pages of mapped files, which the kernel
can drop), each minus its value right before building (torch, transformers and the tokenizer are loaded by
then, and are the same in both). The in-memory case stops at the packed Python lists; the builder it replaced
also copied them into an Arrow table before writing, so its real peak was higher.
Both build the same rows (checked: same row count, same first and last row). Appends
`{"bench","metric","value","target","unit","detail"}` lines to bench/results/sft_rows.jsonl:
- `streamed_peak_rss_mb`, `in_memory_peak_rss_mb` and their ratio, the same for `peak_anon_rss`;
- `streamed_rows_per_s` (trajectories tokenized and packed per second, the tokenize step end to end);
- `streamed_peak_rss_mb_at_4x` when `--scale` is given: the same at 4x the trajectories, showing that the
  streamed build's memory does not grow with the data (only the per-item lengths do: 8 bytes an item).
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training.sft_rows import BATCH_TOKENS, CHUNK  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "sft_rows.jsonl"
MAX_LEN = 1024


def status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(f"{field}:")) / 1024


class AnonPeak:
    """Peak anonymous RSS (RssAnon, sampled every 5 ms on a thread): the process's own memory, without the pages
    of memory-mapped files, which the kernel can drop and re-read (the peak RSS counts those too)."""

    def __init__(self):
        self.peak, self.running = status_mb("RssAnon"), True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, status_mb("RssAnon"))
            time.sleep(0.005)

    def stop(self) -> float:
        self.running = False
        self.thread.join()
        return max(self.peak, status_mb("RssAnon"))


def prepare(n: int, out: Path) -> None:
    """n synthetic trajectories as JSONL (made in this parent process, outside any measurement) and a tokenizer
    trained on the first 2,000 (a save_pretrained tokenizer directory)."""
    from models.format import render_segments, write_jsonl
    from models.tokenizer import train_tokenizer
    from training.synthetic_coa import synthetic_trajectories

    trajectories = synthetic_trajectories(n, seed=0)
    write_jsonl(out / "train.jsonl", trajectories)
    write_jsonl(out / "warmup.jsonl", trajectories[:50])
    tok = train_tokenizer([t.question + render_segments(t.segments) for t in trajectories[:2000]], vocab_size=2048)
    tok.save_pretrained(out / "tokenizer")


def run_case(case: str, data: Path) -> dict:
    """One builder in this (fresh) process: its peak RSS over the pre-build RSS, seconds, and what it built."""
    from models.format import read_jsonl
    from models.tokenizer import load_tokenizer
    from training.sft_data import build_examples, pack_examples
    from training.sft_rows import ROWS_FILE, RowTable, build_rows
    from training.sft_trainer import SFTConfig
    from afm.storage import local_path, open_store

    tokenizer = load_tokenizer(data / "tokenizer")

    def build(dataset: Path, tag: str):
        cfg = SFTConfig(dataset=str(dataset), max_len=MAX_LEN, output_dir=str(data / f"run-{tag}"))
        if case == "streamed":
            uri = build_rows(cfg, tokenizer, open_store(data / f"store-{tag}"), data / f"work-{tag}")
            rows = RowTable(local_path(uri) / ROWS_FILE)
            return len(rows), rows[0][0].input_ids, rows[len(rows) - 1][-1].input_ids
        examples, _ = build_examples(read_jsonl(cfg.dataset), tokenizer, None, MAX_LEN)
        packed = pack_examples(examples, MAX_LEN)
        return len(packed), packed[0][0].input_ids, packed[-1][-1].input_ids

    # A warm-up build on 50 trajectories first: one-time allocations (allocator arenas, tokenizer caches) are
    # then in the starting RSS of both cases, and the figure is what the data adds.
    build(data / "warmup.jsonl", f"{case}-warmup")
    before, anon_before, start = status_mb("VmRSS"), status_mb("RssAnon"), time.perf_counter()
    anon = AnonPeak()
    n_rows, first, last = build(data / "train.jsonl", case)
    seconds = time.perf_counter() - start
    anon_peak = anon.stop()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"case": case, "peak_over_start_mb": peak - before, "anon_peak_over_start_mb": anon_peak - anon_before,
            "start_mb": before, "seconds": seconds, "rows": n_rows, "first": first[:20], "last": last[:20]}


def measure(case: str, data: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--case", case, "--data", str(data)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def emit(metric: str, value: float, target: float | None, unit: str, detail: dict) -> None:
    line = {"bench": "sft_rows", "metric": metric, "value": round(value, 4), "target": target, "unit": unit,
            "detail": detail}
    print(json.dumps(line), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a") as f:
        f.write(json.dumps(line) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20_000, help="synthetic trajectories")
    parser.add_argument("--scale", action="store_true", help="also the streamed build at 4x the trajectories")
    parser.add_argument("--case", choices=["streamed", "in_memory"], help="(internal) run one builder here")
    parser.add_argument("--data", type=Path, help="(internal) the prepared data directory")
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.data)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-sft-rows-") as tmp:
        data = Path(tmp)
        prepare(args.n, data)
        streamed, in_memory = measure("streamed", data), measure("in_memory", data)
        assert (streamed["rows"], streamed["first"], streamed["last"]) == \
            (in_memory["rows"], in_memory["first"], in_memory["last"]), (streamed, in_memory)
        detail = {"trajectories": args.n, "max_len": MAX_LEN, "rows": streamed["rows"], "batch_tokens": BATCH_TOKENS,
                  "chunk": CHUNK,
                  "streamed": streamed, "in_memory": in_memory}
        for case in (streamed, in_memory):
            del case["first"], case["last"]
        for key, name in (("peak_over_start_mb", "peak_rss"), ("anon_peak_over_start_mb", "peak_anon_rss")):
            emit(f"streamed_{name}_mb", streamed[key], None, "MB", detail)
            emit(f"in_memory_{name}_mb", in_memory[key], None, "MB", detail)
            emit(f"streamed_over_in_memory_{name}", streamed[key] / in_memory[key], None, "ratio", detail)
        emit("streamed_rows_per_s", args.n / streamed["seconds"], None, "trajectories/s", detail)
        if args.scale:
            big = Path(tmp) / "x4"
            big.mkdir()
            prepare(4 * args.n, big)
            scaled = measure("streamed", big)
            for key, name in (("peak_over_start_mb", "peak_rss"), ("anon_peak_over_start_mb", "peak_anon_rss")):
                emit(f"streamed_{name}_mb_at_4x", scaled[key], None, "MB",
                     {"trajectories": 4 * args.n, "rows": scaled["rows"], "seconds": scaled["seconds"]})


if __name__ == "__main__":
    main()

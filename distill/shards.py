"""Rollout output as JSONL shards in one directory, each written atomically (temp file + rename).

A shard `shard-<run>-<n>.jsonl` holds MAS logs (one per line); only complete shards carry the `.jsonl` name, so
a crash leaves at most a `.tmp` file behind, which is ignored. `done_keys` lists the (problem_id, sample_idx)
pairs already present, which is how a re-run resumes.

Usage:
    write_shard(out_dir, "run1-00003", logs)
    done = done_keys(out_dir); logs = list(iter_logs(out_dir))
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

from agents.teacher.log import MASLog, MASLogError

SHARD_GLOB = "shard-*.jsonl"


def write_shard(out_dir: Path, name: str, log_dicts: list[dict]) -> Path:
    path = out_dir / f"shard-{name}.jsonl"
    tmp = out_dir / f".shard-{name}.jsonl.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for d in log_dicts:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def shard_paths(out_dir: Path) -> list[Path]:
    return sorted(out_dir.glob(SHARD_GLOB))


def done_keys(out_dir: Path) -> set[tuple[str, int]]:
    keys = set()
    for path in shard_paths(out_dir):
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                    keys.add((str(d["problem_id"]), int(d.get("sample_idx", 0))))
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    raise MASLogError(f"{path}:{lineno}: not a MAS log record: {exc}") from exc
    return keys


def iter_logs(out_dir: Path) -> Iterator[MASLog]:
    """Every MAS log in the directory's complete shards, deduplicated by (problem_id, sample_idx)."""
    seen: set[tuple[str, int]] = set()
    for path in shard_paths(out_dir):
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    log = MASLog.from_dict(json.loads(line))
                except (json.JSONDecodeError, KeyError, TypeError, MASLogError) as exc:
                    raise MASLogError(f"{path}:{lineno}: not a MAS log record: {exc}") from exc
                if (log.problem_id, log.sample_idx) not in seen:
                    seen.add((log.problem_id, log.sample_idx))
                    yield log

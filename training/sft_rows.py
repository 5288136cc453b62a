"""Tokenize and pack the SFT data once into a memory-mapped Arrow file; workers read only the rows they train on.

    rows = tokenized_rows(cfg, tokenizer, builder=local_rank == 0, work_dir=work_dir)
    len(rows); rows[i]            # -> list[SFTExample], read from the mapped file on access; rows.report

Before, every worker tokenized the whole dataset on one thread into Python lists (tens of GB at 16k x 32k
tokens, on every worker). Now one process per machine (local rank 0) tokenizes and packs, writes
`<output_dir>/rows/rows-<key>.arrow` (Arrow IPC, uncompressed, written to a temp name and renamed), and every
worker on that machine maps the same file: the operating system shares its pages, and a worker touches only
the rows of its own micro-batches. The key hashes what the rows depend on: the dataset digest, the tokenizer
(vocabulary, merges, added tokens, chat template), the system prompt, max_len, packing, data format and observation labels; a second run
with the same inputs reuses the file.

Layout: one record per packed row: `input_ids` and `labels` (list<int32>, the row's examples concatenated),
`lengths` (list<int32>, each example's length); the DataReport rides in the schema metadata.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import torch.distributed as dist

from models.format import read_jsonl
from training.pairwise_loss import build_pair_examples, pack_pairs, read_pair_dicts
from training.sft_data import DataReport, SFTExample, build_examples, dataset_identity, pack_examples, resolve_dataset
from training.text_data import build_text_examples, read_text_records

if TYPE_CHECKING:
    from training.sft_trainer import SFTConfig

_REPORT_KEY = b"afm.data_report"


class RowTable:
    """Packed rows in a memory-mapped Arrow file, indexable like a list of rows of examples."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.table = pa.ipc.open_file(pa.memory_map(str(self.path))).read_all()  # zero-copy: pages load on access
        self.report = DataReport(**json.loads(self.table.schema.metadata[_REPORT_KEY]))

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, index: int) -> list[SFTExample]:
        ids, labels, lengths = (self.table.column(name)[index].values.to_numpy() for name in ("input_ids", "labels", "lengths"))
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        return [SFTExample(ids[s:e].tolist(), labels[s:e].tolist()) for s, e in zip(bounds[:-1], bounds[1:])]


def write_rows(rows: list[list[SFTExample]], report: DataReport, path: Path) -> Path:
    """Write packed rows atomically (temp file + rename) as an uncompressed Arrow IPC file."""
    ints = pa.list_(pa.int32())
    table = pa.table({
        "input_ids": pa.array([[t for e in row for t in e.input_ids] for row in rows], type=ints),
        "labels": pa.array([[t for e in row for t in e.labels] for row in rows], type=ints),
        "lengths": pa.array([[len(e) for e in row] for row in rows], type=ints),
    }).replace_schema_metadata({_REPORT_KEY: json.dumps(asdict(report))})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    os.replace(tmp, path)
    return path


def rows_key(cfg: "SFTConfig", tokenizer: Any) -> str:
    """16 hex chars identifying the rows that these data, tokenizer and settings produce."""
    _, digest = dataset_identity(cfg.dataset)
    tok = hashlib.sha256((tokenizer.backend_tokenizer.to_str() + (tokenizer.chat_template or "")).encode()).hexdigest()
    payload = {"dataset": digest, "tokenizer": tok, "system_prompt": cfg.system_prompt, "max_len": cfg.max_len,
               "pack": cfg.pack, "data_format": cfg.data_format, "learn_observations": cfg.learn_observations}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def tokenized_rows(cfg: "SFTConfig", tokenizer: Any, builder: bool, work_dir: Path) -> RowTable:
    """Collective when a process group exists: the builder (one per machine) writes the rows file unless it
    exists; everyone waits for it, then maps it."""
    path = Path(cfg.output_dir) / "rows" / f"rows-{rows_key(cfg, tokenizer)}.arrow"
    if builder and not path.is_file():
        data_path, _ = resolve_dataset(cfg.dataset, cfg.dataset_file, work_dir)
        if cfg.data_format == "pairs":  # AutoCoA's when-to-act pairs: rows of whole pairs [c, r, c, r, ...]
            pairs, report = build_pair_examples(read_pair_dicts(data_path), tokenizer, cfg.system_prompt, cfg.max_len)
            rows = pack_pairs(pairs, cfg.max_len, cfg.pack)
        else:
            if cfg.data_format == "text":  # the pretraining stage: documents, every token a target
                examples, report = build_text_examples(read_text_records(data_path), tokenizer, cfg.max_len)
            else:
                examples, report = build_examples(read_jsonl(data_path), tokenizer, cfg.system_prompt, cfg.max_len,
                                                  cfg.learn_observations)
            rows = pack_examples(examples, cfg.max_len) if cfg.pack else [[e] for e in examples]
        write_rows(rows, report, path)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
    return RowTable(path)

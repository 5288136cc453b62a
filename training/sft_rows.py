"""Tokenize and pack the SFT data once, as its own step, into an Arrow file in the artifact store; workers
memory-map it and read only the rows of their own micro-batches.

    uri = prepare_rows(cfg, work_dir)                   # the step, before the job: <store>/rows/<key>, reused
    uri = build_rows(cfg, tokenizer, store, work_dir)   # the same with the job's tokenizer (rank 0 in the job)
    rows = RowTable(rows_file(uri, cache_dir, fetch=True))  # local store: in place; s3: fetched once per machine
    rows = tokenized_rows(cfg, tokenizer, rank, local_rank, work_dir)   # the trainer's collective: both, once
    len(rows); rows[i]; rows.report                     # rows[i] -> list[SFTExample], read from the mapped file

The step. The SFT and pretraining stages run it before the job starts (`prepare_rows`: the job's tokenizer
read without its weights); inside the job global rank 0 runs it again, which then only reads the manifest
(for a direct caller of the trainer it is where the rows are built). The key hashes the dataset digest, the
tokenizer (vocabulary, merges, added tokens, chat template), the system prompt, max_len, packing, data
format, dataset file, observation labels, and the source of the modules that turn records into rows; the
artifact `rows/<key>` lives in `sft.rows_store` (the stages pass the pipeline's store, so a rerun or a
second SFT on the same data and tokenizer reuses the rows; '' keeps them under `<output_dir>/rows`, for this
job only). Only when it is absent is anything tokenized, and streamed: the builders of training/sft_data.py,
text_data.py and pairwise_loss.py run on CHUNK records at a time and each chunk goes straight into Arrow
record batches of "items" (an example, or a pair's two branches, which share a row); packing then needs only
the items' lengths (one int each), best-fit-decreasing as before, and writes the rows batch by batch from
the mapped item file. No Python list of the whole data set's tokens exists at any point. The rows file is
uploaded with the artifact's manifest last (afm/storage.py); rank 0 broadcasts the artifact URI.

Workers: on a local store every worker maps the file in place; on S3 local rank 0 of each machine fetches
it (sha256-verified) into `<output_dir>/rows/fetched` and the machine's workers map that copy. Mapping is
zero-copy: the operating system shares the pages between the workers of a machine and a worker touches only
the rows its micro-batches read (training/sft_trainer.py `shard_rows`).

Layout: one record per packed row: `input_ids` and `labels` (list<int32>, the row's examples concatenated),
`lengths` (list<int32>, each example's length); the DataReport rides in the schema metadata.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import torch.distributed as dist

import models.format
import models.tokenizer
import training.pairwise_loss
import training.sft_data
import training.text_data
from afm.storage import MANIFEST_NAME, ArtifactStore, local_path, open_store
from models.format import read_jsonl
from models.policy import load_policy
from models.policy_tokens import add_coa_special_tokens
from training.pairwise_loss import build_pair_examples, read_pair_dicts
from training.sft_data import DataReport, SFTExample, best_fit_rows, build_examples, dataset_identity, resolve_dataset
from training.text_data import build_text_examples, read_text_records

if TYPE_CHECKING:
    from training.sft_trainer import SFTConfig

ROWS_FILE = "rows.arrow"
_REPORT_KEY = b"afm.data_report"
# Records tokenized per builder call: the builders return Python lists, so this bounds them (64 trajectories
# of 32k tokens ~ 150 MB of Python ints; at the default max_len a few MB).
CHUNK = 64
# Tokens per Arrow record batch: bounds what is held before a batch is written. The build's peak memory is
# about 25 bytes a batch token (the rows' arrays, their concatenation, the Arrow columns): ~25 MB at 1M tokens
# (bench/bench_sft_rows.py measured ~4x that at 4M, where a 20k-trajectory set was a single batch).
BATCH_TOKENS = 1 << 20
_INTS = pa.list_(pa.int32())
_SCHEMA = pa.schema([("input_ids", _INTS), ("labels", _INTS), ("lengths", _INTS)])
# The code that turns records into rows: an edit to any of these makes new rows (the stage keys of
# tasks/stages.py cover code the same way; this key is computed inside the job, where tasks/ is not imported).
_ROW_CODE = (models.format, models.tokenizer, training.sft_data, training.text_data, training.pairwise_loss)
# Files of a stored checkpoint that the tokenizer does not need (prepare_rows fetches the others).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]  # one row or item: input_ids, labels, example lengths


class RowTable:
    """Packed rows in a memory-mapped Arrow file, indexable like a list of rows of examples."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.table = pa.ipc.open_file(pa.memory_map(str(self.path))).read_all()  # zero-copy: pages load on access
        metadata = self.table.schema.metadata or {}
        self.report = DataReport(**json.loads(metadata[_REPORT_KEY])) if _REPORT_KEY in metadata else None

    def __len__(self) -> int:
        return self.table.num_rows

    def arrays(self, index: int) -> Arrays:
        """Row `index` as numpy views into the mapped file."""
        return tuple(self.table.column(name)[index].values.to_numpy() for name in _SCHEMA.names)

    def __getitem__(self, index: int) -> list[SFTExample]:
        ids, labels, lengths = self.arrays(index)
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        return [SFTExample(ids[s:e].tolist(), labels[s:e].tolist()) for s, e in zip(bounds[:-1], bounds[1:])]


def _record_batch(rows: Sequence[Arrays]) -> pa.RecordBatch:
    def column(parts: list[np.ndarray]) -> pa.Array:
        offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(parts).astype(np.int32, copy=False)))

    return pa.record_batch([column([row[i] for row in rows]) for i in range(3)], schema=_SCHEMA)


class _BatchWriter:
    """Arrow IPC file writer that buffers rows up to BATCH_TOKENS and writes them as one record batch."""

    def __init__(self, path: Path, metadata: dict[bytes, bytes] | None = None):
        self.sink = pa.OSFile(str(path), "wb")
        self.writer = pa.ipc.new_file(self.sink, _SCHEMA.with_metadata(metadata) if metadata else _SCHEMA)
        self.pending: list[Arrays] = []
        self.tokens = 0

    def add(self, row: Arrays) -> None:
        self.pending.append(row)
        self.tokens += len(row[0])
        if self.tokens >= BATCH_TOKENS:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.writer.write_batch(_record_batch(self.pending))
        self.pending, self.tokens = [], 0

    def close(self) -> None:
        self.flush()
        self.writer.close()
        self.sink.close()


def _chunks(records: Iterable[Any]) -> Iterator[list[Any]]:
    iterator = iter(records)
    while chunk := list(itertools.islice(iterator, CHUNK)):
        yield chunk


Items = list[list[SFTExample]]  # each item: the examples that must share a row


def item_chunks(cfg: "SFTConfig", tokenizer: Any, data_path: Path) -> Iterator[tuple[Items, DataReport]]:
    """(items, report) of CHUNK records at a time, in record order: an item is the examples that share a row
    whatever the packing (one example, or a when-to-act pair's chosen and rejected branches)."""
    if cfg.data_format == "pairs":
        # A record without an id is reported by its position in the file, as build_pair_examples does on a whole file.
        records = ({"id": i, **record} for i, record in enumerate(read_pair_dicts(data_path)))
        for chunk in _chunks(records):
            pairs, report = build_pair_examples(chunk, tokenizer, cfg.system_prompt, cfg.max_len)
            yield [list(pair) for pair in pairs], report
    elif cfg.data_format == "text":  # the pretraining stage: documents, every token a target
        for chunk in _chunks(read_text_records(data_path)):
            examples, report = build_text_examples(chunk, tokenizer, cfg.max_len)
            yield [[e] for e in examples], report
    else:
        for chunk in _chunks(read_jsonl(data_path)):
            examples, report = build_examples(chunk, tokenizer, cfg.system_prompt, cfg.max_len, cfg.learn_observations)
            yield [[e] for e in examples], report


def _item_arrays(item: list[SFTExample]) -> Arrays:
    return (np.array([t for e in item for t in e.input_ids], dtype=np.int32),
            np.array([t for e in item for t in e.labels], dtype=np.int32),
            np.array([len(e) for e in item], dtype=np.int32))


def write_items(chunks: Iterable[tuple[Items, DataReport]], path: Path) -> DataReport:
    """Pass 1: every item into `path` (rows layout, one item a record), batch by batch; returns the report."""
    report, writer = DataReport(), _BatchWriter(path)
    for items, chunk_report in chunks:
        report.add(chunk_report)
        for item in items:
            writer.add(_item_arrays(item))
    writer.close()
    return report


def pack_items(items_path: Path, report: DataReport, max_len: int, pack: bool, path: Path) -> None:
    """Pass 2: rows of items (best-fit decreasing on their lengths, or one item a row) from the mapped item file
    into `path`, batch by batch, the report in the schema metadata."""
    items = RowTable(items_path)
    if pack:
        chunks = items.table.column("input_ids").chunks
        lengths = np.concatenate([np.zeros(0, np.int32)] + [np.diff(chunk.offsets.to_numpy()) for chunk in chunks])
        layout = best_fit_rows(lengths.tolist(), max_len)
    else:
        layout = ([i] for i in range(len(items)))
    writer = _BatchWriter(path, {_REPORT_KEY: json.dumps(asdict(report)).encode()})
    for row in layout:
        parts = [items.arrays(i) for i in row]
        writer.add(tuple(np.concatenate([part[c] for part in parts]) for c in range(3)))
    writer.close()


def _source_digest() -> str:
    digest = hashlib.sha256()
    for module in (*_ROW_CODE, sys.modules[__name__]):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()


def rows_key(cfg: "SFTConfig", tokenizer: Any) -> str:
    """16 hex chars identifying the rows that these data, tokenizer, settings and code produce."""
    _, digest = dataset_identity(cfg.dataset)
    tok = hashlib.sha256((tokenizer.backend_tokenizer.to_str() + (tokenizer.chat_template or "")).encode()).hexdigest()
    payload = {"dataset": digest, "dataset_file": cfg.dataset_file, "tokenizer": tok,
               "system_prompt": cfg.system_prompt, "max_len": cfg.max_len, "pack": cfg.pack,
               "data_format": cfg.data_format, "learn_observations": cfg.learn_observations, "code": _source_digest()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def rows_store(cfg: "SFTConfig") -> ArtifactStore:
    """Where the job's rows artifact lives: `cfg.rows_store`, or the job's `output_dir` (`<output_dir>/rows/<key>`,
    this job only)."""
    return open_store(cfg.rows_store or cfg.output_dir)


def build_rows(cfg: "SFTConfig", tokenizer: Any, store: ArtifactStore, work_dir: Path) -> str:
    """The tokenize step: the URI of the rows artifact for these inputs, tokenized and stored unless it exists."""
    name = f"rows/{rows_key(cfg, tokenizer)}"
    if store.read_manifest(name) is None:
        data_path, _ = resolve_dataset(cfg.dataset, cfg.dataset_file, work_dir)
        Path(work_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="rows-", dir=work_dir) as tmp:
            items = Path(tmp) / "items.arrow"
            report = write_items(item_chunks(cfg, tokenizer, data_path), items)
            pack_items(items, report, cfg.max_len, cfg.pack, Path(tmp) / ROWS_FILE)
            store.write_artifact(name, {ROWS_FILE: Path(tmp) / ROWS_FILE}, kind="rows",
                                 extra={"rows_of": {"dataset": cfg.dataset, "dataset_file": cfg.dataset_file,
                                                    "max_len": cfg.max_len, "pack": cfg.pack,
                                                    "data_format": cfg.data_format}})
    return store.artifact_uri(name)


def job_tokenizer(model_path: str, work_dir: Path) -> Any:
    """The tokenizer a job's workers train with (the CoA tags special tokens, models/policy_tokens.py), read
    without the weights: the model is built on the meta device, and of an s3:// checkpoint only the files that
    are not weights are fetched."""
    path = local_path(model_path)
    if str(model_path).startswith("s3://"):
        root, _, name = str(model_path).rstrip("/").rpartition("/")
        store, path = open_store(root), Path(work_dir) / "tokenizer"
        for rel_name in store.read_manifest(name)["files"]:
            if not rel_name.endswith(_WEIGHT_SUFFIXES):
                store.download_file(f"{name}/{rel_name}", path / rel_name)
    model, tokenizer = load_policy(path, device="meta")
    add_coa_special_tokens(model, tokenizer)
    return tokenizer


def prepare_rows(cfg: "SFTConfig", work_dir: Path) -> str:
    """The tokenize step on its own, before a job's workers start (the SFT and pretraining stages run it): the
    job's rank 0 then finds the rows stored, instead of tokenizing while the other workers wait in a collective
    whose timeout (30 min under Ray Train) a large data set can exceed. Returns the rows artifact's URI."""
    return build_rows(cfg, job_tokenizer(cfg.model_path, work_dir), rows_store(cfg), work_dir)


def rows_file(uri: str, cache_dir: Path, fetch: bool) -> Path:
    """The local rows file of the artifact at `uri`: a local artifact's own file; for an s3:// one its copy in
    `cache_dir`, which this process downloads (sha256-verified) when `fetch` and the copy is not complete yet."""
    if not uri.startswith("s3://"):
        return local_path(uri) / ROWS_FILE
    root, _, name = uri.rstrip("/").rpartition("/")
    local = Path(cache_dir) / name
    if fetch and not (local / MANIFEST_NAME).is_file():  # fetch_artifact writes the manifest last
        open_store(root).fetch_artifact(name, local)
    return local / ROWS_FILE


def tokenized_rows(cfg: "SFTConfig", tokenizer: Any, rank: int, local_rank: int, work_dir: Path) -> RowTable:
    """Collective when a process group exists: rank 0 runs the tokenize step (a manifest read when the rows
    are stored already, e.g. by `prepare_rows`) and broadcasts the URI; local rank 0 of each machine fetches a
    remote file; all map it."""
    grouped = dist.is_initialized() and dist.get_world_size() > 1
    uri = [build_rows(cfg, tokenizer, rows_store(cfg), work_dir) if rank == 0 else None]
    if grouped:
        dist.broadcast_object_list(uri, src=0)
    cache_dir = Path(cfg.output_dir) / "rows" / "fetched"
    path = rows_file(uri[0], cache_dir, fetch=local_rank == 0)
    if grouped:
        dist.barrier()
    return RowTable(path)

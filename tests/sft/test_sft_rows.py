"""The tokenize step (training/sft_rows.py): a streamed Arrow rows artifact in the store that equals the in-memory
builder's rows, is built once per inputs and reused by the next job, can be prepared before the job, reaches
workers by URI (fetched once per machine from S3), and is read by 2 workers as disjoint shards that cover every
row once.

    .venv/bin/pytest -q tests/sft/test_sft_rows.py        # seconds
"""
from __future__ import annotations

import json
import tracemalloc
import uuid
from dataclasses import asdict

import pyarrow as pa
import pytest

from afm.storage import LocalStore, directory_files, local_path, open_store
from models.format import read_jsonl, write_jsonl
from models.policy import load_policy
from models.policy_tokens import add_coa_special_tokens
from training import sft_rows
from training.pairwise_loss import build_pair_examples, pack_pairs, read_pair_dicts
from training.sft_data import build_examples, collate_rows, epoch_row_order, pack_examples
from training.sft_rows import ROWS_FILE, RowTable, build_rows, prepare_rows, tokenized_rows
from training.sft_trainer import run_sft_local, shard_rows
from training.synthetic_coa import synthetic_trajectories
from training.text_data import build_text_examples, read_text_records


@pytest.fixture
def small_batches(monkeypatch):
    """Chunks of 5 records and record batches of ~512 tokens, so the fixture data spans many of both."""
    monkeypatch.setattr(sft_rows, "CHUNK", 5)
    monkeypatch.setattr(sft_rows, "BATCH_TOKENS", 512)


@pytest.fixture
def tokenize_calls(monkeypatch):
    """How many times the tokenize step actually tokenized (calls of its record -> items pass)."""
    calls = []
    real = sft_rows.item_chunks

    def counted(*args):
        calls.append(args[0].dataset)
        return real(*args)

    monkeypatch.setattr(sft_rows, "item_chunks", counted)
    return calls


def in_memory_rows(cfg, tokenizer, path):
    """What the trainer built before the step existed: the whole data set as Python lists, then packed."""
    if cfg.data_format == "pairs":
        pairs, report = build_pair_examples(read_pair_dicts(path), tokenizer, cfg.system_prompt, cfg.max_len)
        return pack_pairs(pairs, cfg.max_len, cfg.pack), report
    if cfg.data_format == "text":
        examples, report = build_text_examples(read_text_records(path), tokenizer, cfg.max_len)
    else:
        examples, report = build_examples(read_jsonl(path), tokenizer, cfg.system_prompt, cfg.max_len)
    return (pack_examples(examples, cfg.max_len) if cfg.pack else [[e] for e in examples]), report


def as_lists(rows):
    return [[(e.input_ids, e.labels) for e in row] for row in rows]


def write_pairs(path, trajectories):
    with open(path, "w") as f:
        for i, traj in enumerate(trajectories):
            record = {"question": traj.question, "prefix": "", "chosen": "<answer>yes</answer>",
                      "rejected": "<answer>" + " no" * (i * 7 % 40) + "</answer>"}
            if i % 3:  # every third record has no id: a dropped one is reported by its position
                record["id"] = f"p{i}"
            f.write(json.dumps(record) + "\n")
    return path


def write_texts(path, trajectories):
    with open(path, "w") as f:
        for traj in trajectories:
            f.write(json.dumps({"text": (traj.question + " ") * 12}) + "\n")
    return path


@pytest.mark.parametrize("data_format,pack", [("trajectories", True), ("trajectories", False), ("text", True),
                                              ("pairs", True), ("pairs", False)])
def test_streamed_rows_equal_the_in_memory_builder(sft_cfg, tokenizer, trajectories, dataset_file, tmp_path,
                                                   small_batches, data_format, pack):
    path = {"trajectories": lambda: dataset_file, "text": lambda: write_texts(tmp_path / "texts.jsonl", trajectories),
            "pairs": lambda: write_pairs(tmp_path / "pairs.jsonl", trajectories)}[data_format]()
    cfg = sft_cfg.model_copy(update={"dataset": str(path), "data_format": data_format, "pack": pack,
                                     "max_len": 256 if data_format != "pairs" else 110,
                                     "objective": "pairwise" if data_format == "pairs" else "sft"})
    rows = tokenized_rows(cfg, tokenizer, 0, 0, tmp_path / "data")
    expected, report = in_memory_rows(cfg, tokenizer, path)
    assert len(rows) == len(expected) and rows.report == report and report.examples > 0
    assert as_lists(rows[i] for i in range(len(rows))) == as_lists(expected)
    if data_format == "pairs":
        assert 0 < report.dropped_too_long and any(i.isdigit() for i in report.dropped_ids)
    # The file was written in many record batches, none much over BATCH_TOKENS (one row past it at most).
    batches = pa.ipc.open_file(pa.memory_map(str(rows.path)))
    sizes = [len(batches.get_batch(b).column("input_ids").values) for b in range(batches.num_record_batches)]
    assert len(sizes) >= report.tokens // (512 + cfg.max_len) and max(sizes) < 512 + cfg.max_len


def test_trainer_batches_equal_the_in_memory_builder(sft_cfg, tokenizer, dataset_file, tmp_path):
    """The same input_ids / labels / position_ids for every micro-batch of an epoch, on 2 workers."""
    rows = tokenized_rows(sft_cfg, tokenizer, 0, 0, tmp_path / "data")
    expected, _ = in_memory_rows(sft_cfg, tokenizer, dataset_file)
    order = epoch_row_order(len(rows), sft_cfg.seed, 0)
    steps = len(rows) // (sft_cfg.micro_batch * 2)
    for step in range(steps):
        for rank in (0, 1):
            for indices in shard_rows(sft_cfg, rank, 2, steps, step, order):
                new, old = collate_rows([rows[i] for i in indices]), collate_rows([expected[i] for i in indices])
                assert new.keys() == old.keys() and all(new[k].equal(old[k]) for k in new)


def test_two_workers_read_disjoint_shards_that_cover_every_row_once(sft_cfg):
    cfg = sft_cfg.model_copy(update={"micro_batch": 3, "grad_accum": 2})
    n_rows, world = 12 * 5, 2  # 5 steps of 12 rows
    order = epoch_row_order(n_rows, cfg.seed, 0)
    read = {rank: [i for step in range(5) for batch in shard_rows(cfg, rank, world, 5, step, order) for i in batch]
            for rank in range(world)}
    assert not set(read[0]) & set(read[1])
    assert sorted(read[0] + read[1]) == list(range(n_rows))


def test_rows_artifact_is_built_once_and_reused_by_the_next_sft(sft_cfg, tokenizer, tmp_path, tokenize_calls):
    store = tmp_path / "store"
    cfg = sft_cfg.model_copy(update={"rows_store": str(store), "max_steps": 1})
    first = run_sft_local(cfg.model_copy(update={"output_dir": str(tmp_path / "one")}))
    second = run_sft_local(cfg.model_copy(update={"output_dir": str(tmp_path / "two"), "lr": 1e-3}))
    assert len(tokenize_calls) == 1 and first.data == second.data
    artifacts = [k for k in LocalStore(store).list("rows/") if k.endswith(ROWS_FILE)]
    assert len(artifacts) == 1
    # Other settings are other rows, in an artifact of their own.
    unpacked = build_rows(sft_cfg.model_copy(update={"pack": False}), tokenizer, open_store(store), tmp_path / "data")
    assert len(tokenize_calls) == 2 and unpacked.rpartition("/")[2] not in artifacts[0]
    assert len(RowTable(local_path(unpacked) / ROWS_FILE)) == first.data.examples


@pytest.mark.integration  # the moto S3 server
def test_s3_rows_are_prepared_before_the_job_fetched_once_per_machine_and_mapped(
        sft_cfg, tokenizer, policy_dir, tmp_path, s3_env, tokenize_calls, monkeypatch):
    bucket = f"afm-rows-{uuid.uuid4().hex[:8]}"
    s3_env.create_bucket(Bucket=bucket)
    open_store(f"s3://{bucket}/artifacts").write_artifact("policy", directory_files(policy_dir), kind="model")
    cfg = sft_cfg.model_copy(update={"rows_store": f"s3://{bucket}/artifacts",
                                     "model_path": f"s3://{bucket}/artifacts/policy"})
    # The stage's step, before any worker: the checkpoint's tokenizer is read without fetching its weights.
    uri = prepare_rows(cfg, tmp_path / "step")
    assert len(tokenize_calls) == 1 and uri == f"s3://{bucket}/artifacts/rows/{uri.rpartition('/')[2]}"
    assert (tmp_path / "step" / "tokenizer" / "tokenizer.json").is_file()
    assert not list((tmp_path / "step").rglob("*.safetensors"))
    fetches = []
    real_open_store = sft_rows.open_store

    def counted_store(uri):
        store = real_open_store(uri)
        fetch = store.fetch_artifact
        store.fetch_artifact = lambda *a: fetches.append(a) or fetch(*a)
        return store

    monkeypatch.setattr(sft_rows, "open_store", counted_store)
    # In the job, with the tokenizer the trainer's setup makes: rank 0 finds the prepared rows.
    model, job_tokenizer = load_policy(policy_dir)
    add_coa_special_tokens(model, job_tokenizer)
    rows = tokenized_rows(cfg, job_tokenizer, 0, 0, tmp_path / "data")
    assert len(tokenize_calls) == 1 and len(fetches) == 1
    assert rows.path.is_relative_to(tmp_path / "run" / "rows" / "fetched")
    local = tokenized_rows(sft_cfg, tokenizer, 0, 0, tmp_path / "local")
    assert as_lists(rows[i] for i in range(len(rows))) == as_lists(local[i] for i in range(len(local)))
    assert asdict(rows.report) == asdict(local.report)
    # Another worker of the machine (not local rank 0) maps the same copy; nothing is tokenized or fetched again.
    again = tokenized_rows(cfg, job_tokenizer, 0, 1, tmp_path / "other")
    assert again.path == rows.path and len(fetches) == 1 and len(tokenize_calls) == 2


def test_streamed_build_memory_does_not_grow_with_the_data(sft_cfg, tokenizer, tmp_path, small_batches):
    """Peak Python allocations (tracemalloc) of the step's two passes at 1x and 4x the trajectories: flat, where
    the in-memory builder's grow with the data. (Measured after a warm-up, so imports and caches are not in it.)"""
    def streamed(cfg, path, out):
        report = sft_rows.write_items(sft_rows.item_chunks(cfg, tokenizer, path), out / "items.arrow")
        sft_rows.pack_items(out / "items.arrow", report, cfg.max_len, cfg.pack, out / ROWS_FILE)

    def in_memory(cfg, path, out):
        return in_memory_rows(cfg, tokenizer, path)

    peaks = {}
    for n in (60, 60, 240):  # the first 60 is the warm-up
        path = tmp_path / f"train-{n}.jsonl"
        write_jsonl(path, synthetic_trajectories(n, seed=1))
        cfg = sft_cfg.model_copy(update={"dataset": str(path)})
        for build in (streamed, in_memory):
            tracemalloc.start()
            build(cfg, path, tmp_path)
            peaks[build.__name__, n] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    assert peaks["streamed", 240] < 1.3 * peaks["streamed", 60]
    assert peaks["in_memory", 240] > 3 * peaks["in_memory", 60]


def test_prepared_rows_match_the_jobs_tokenizer_for_a_real_style_checkpoint(tmp_path, dataset_file, tokenize_calls):
    """A checkpoint whose tags are plain text (ChatML BPE, Qwen2.5 template): the step's weightless tokenizer
    gets the same added tag tokens as the trainer's setup, so the job finds the prepared rows."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from models.policy import save_policy
    from tests.models.conftest import qwen_like_tokenizer
    from training.sft_trainer import SFTConfig

    tok = qwen_like_tokenizer()
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, intermediate_size=32,
                                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    cfg = SFTConfig(model_path=str(save_policy(model, tok, tmp_path / "qwen-like")), dataset=str(dataset_file),
                    max_len=256, output_dir=str(tmp_path / "run"))
    uri = prepare_rows(cfg, tmp_path / "step")
    job_model, job_tokenizer = load_policy(cfg.model_path)
    assert add_coa_special_tokens(job_model, job_tokenizer)  # the tags were not special before
    rows = tokenized_rows(cfg, job_tokenizer, 0, 0, tmp_path / "data")
    assert len(tokenize_calls) == 1 and rows.path == local_path(uri) / ROWS_FILE and len(rows) > 0

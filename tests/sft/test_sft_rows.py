"""Tokenized rows on disk: the mapped file gives back exactly the packed rows, built once and reused."""
from __future__ import annotations

from models.format import read_jsonl
from training.sft_data import build_examples, pack_examples
from training.sft_rows import tokenized_rows


def test_rows_file_round_trips_the_packed_rows_and_is_built_once(sft_cfg, tokenizer, dataset_file, tmp_path):
    rows = tokenized_rows(sft_cfg, tokenizer, builder=True, work_dir=tmp_path / "data")
    examples, report = build_examples(read_jsonl(dataset_file), tokenizer, sft_cfg.system_prompt, sft_cfg.max_len)
    expected = pack_examples(examples, sft_cfg.max_len)
    assert len(rows) == len(expected) and rows.report == report
    for i, row in enumerate(expected):
        assert [(e.input_ids, e.labels) for e in rows[i]] == [(e.input_ids, e.labels) for e in row]
    # Another worker of the machine (not the builder) maps the same file; nothing is tokenized again.
    again = tokenized_rows(sft_cfg, tokenizer, builder=False, work_dir=tmp_path / "other")
    assert again.path == rows.path and len(list(rows.path.parent.iterdir())) == 1
    # Other settings make other rows.
    unpacked = tokenized_rows(sft_cfg.model_copy(update={"pack": False}), tokenizer, builder=True, work_dir=tmp_path / "data")
    assert unpacked.path != rows.path and len(unpacked) == report.examples

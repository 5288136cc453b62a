"""Loaders: every format parses, format is sniffed, bad rows are reported with file and line, S3 works."""
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from problems.loaders import hotpotqa_corpus, last_boxed, load_problems
from problems.records import Problem, ProblemFormatError, write_problems

HOTPOT = [{
    "_id": "5a8b57f25542995d1e6f1371", "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
    "answer": "yes", "type": "comparison", "level": "hard",
    "supporting_facts": [["Scott Derrickson", 0], ["Ed Wood", 0]],
    "context": [["Scott Derrickson", ["Scott Derrickson is an American director.", " He lives in LA."]],
                ["Ed Wood", ["Edward Wood Jr. was an American filmmaker."]]],
}]


def _jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_each_format_is_sniffed_and_converted(tmp_path):
    hp = tmp_path / "hotpot_dev.json"
    hp.write_text(json.dumps(HOTPOT))
    rep = load_problems(hp)
    assert rep.fmt == "hotpotqa" and not rep.errors
    p = rep.problems[0]
    assert (p.id, p.answers, p.family, p.metadata["type"]) == ("5a8b57f25542995d1e6f1371", ["yes"], "hotpotqa", "comparison")
    corpus = hotpotqa_corpus(rep.problems)
    assert corpus[0]["title"] == "Scott Derrickson" and "American director. He lives" in corpus[0]["text"]

    gsm = _jsonl(tmp_path / "gsm.jsonl", [{"question": "Tom has 3 apples...", "answer": "3*400=1200\n#### 1,200"}])
    rep = load_problems(gsm, split="train")
    assert rep.fmt == "gsm8k" and rep.problems[0].answers == ["1200"] and rep.problems[0].split == "train"
    assert rep.problems[0].metadata["solution"] == "3*400=1200"

    afm = _jsonl(tmp_path / "afm.jsonl", [{"question": "Who?", "answer": ["Ann", "Ann B."], "data_source": "musique"}])
    rep = load_problems(afm)
    assert rep.fmt == "afm_qa" and rep.problems[0].answers == ["Ann", "Ann B."] and rep.problems[0].source == "musique"

    math = _jsonl(tmp_path / "math.jsonl", [
        {"problem": "Compute 1+1.", "answer": "2"},
        {"problem": "Simplify.", "solution": "So we get $\\boxed{\\frac{1}{2}}$, not \\boxed{3}? No: \\boxed{\\frac{a}{b}}."},
    ])
    rep = load_problems(math)
    assert rep.fmt == "math" and [p.answers for p in rep.problems] == [["2"], ["\\frac{a}{b}"]]

    ours = tmp_path / "ours.jsonl"
    write_problems(ours, [Problem("x1", "Q?", ["A"], "multihop", "heldout")])
    rep = load_problems(ours)
    assert rep.fmt == "problems" and rep.problems[0].split == "heldout"


def test_parquet_and_verl_rows(tmp_path):
    rows = [{"data_source": "hotpotqa", "prompt": [{"role": "user", "content": "Who directed X?"}],
             "reward_model": {"ground_truth": "Ann|Ann B."}, "extra_info": {"index": 7, "question": "Who directed X?"}}]
    path = tmp_path / "rl.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    rep = load_problems(path)
    assert rep.fmt == "verl" and not rep.errors
    assert (rep.problems[0].id, rep.problems[0].answers) == ("7", ["Ann", "Ann B."])

    gsm = tmp_path / "gsm.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "q", "answer": "x\n#### 5"}, {"question": "r", "answer": "none"}]), gsm)
    rep = load_problems(gsm)
    assert [p.answers for p in rep.problems] == [["5"]]
    assert len(rep.errors) == 1 and rep.errors[0].startswith(f"{gsm}: row 2:") and "####" in rep.errors[0]


def test_bad_rows_are_reported_with_file_and_line_never_dropped(tmp_path):
    path = _jsonl(tmp_path / "gsm.jsonl", [
        {"question": "ok", "answer": "#### 1"},
        "{not json",
        {"question": "", "answer": "#### 2"},
        {"question": "no marker", "answer": "42"},
        {"question": "ok2", "answer": "#### 3"},
    ])
    rep = load_problems(path, fmt="gsm8k")
    assert [p.answers[0] for p in rep.problems] == ["1", "3"]
    assert len(rep.errors) == 3
    assert rep.errors[0].startswith(f"{path}:2: not valid JSON")
    assert rep.errors[1].startswith(f"{path}:3: field 'question'")
    assert rep.errors[2].startswith(f"{path}:4: field 'answer' has no final '#### <number>'")
    with pytest.raises(ProblemFormatError, match=rf"{path}:2:"):
        load_problems(path, fmt="gsm8k", strict=True)
    assert len(load_problems(path, fmt="gsm8k", limit=1).problems) == 1


def test_unknown_shape_and_missing_file_say_what_to_do(tmp_path):
    odd = _jsonl(tmp_path / "odd.jsonl", [{"foo": 1}])
    with pytest.raises(ProblemFormatError, match="pass fmt="):
        load_problems(odd)
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_problems(tmp_path / "missing.jsonl")
    assert last_boxed("no box") is None


@pytest.mark.integration
def test_loads_from_s3(tmp_path, s3_env):
    s3_env.create_bucket(Bucket="datasets")
    s3_env.put_object(Bucket="datasets", Key="gsm8k/test.jsonl",
                         Body=b'{"question": "q", "answer": "#### 9"}\n{"question": "r"}\n')
    rep = load_problems("s3://datasets/gsm8k/test.jsonl")
    assert [p.answers for p in rep.problems] == [["9"]]
    assert rep.errors == ["s3://datasets/gsm8k/test.jsonl:2: field 'answer' is missing or not a non-empty string "
                          "(got NoneType) [format gsm8k]"]

"""verl parquet export: rows read back with pyarrow, and the verl reward entry point scores them."""
from __future__ import annotations

import pyarrow.parquet as pq

from problems.records import Problem
from training.rewards import compute_score
from training.verl_export import read_verl_parquet, write_verl_parquet


def test_export_reads_back_and_scores(tmp_path):
    problems = [
        Problem(id="c1", question="What is 2 plus 3?", answers=["5"], family="computation"),
        Problem(id="m1", question="Where was X born?", answers=["Paris", "Paris, France"], family="multihop"),
    ]
    path = tmp_path / "rl" / "train.parquet"
    assert write_verl_parquet(problems, path) == 2
    schema = pq.read_schema(path)
    assert {"data_source", "prompt", "reward_model", "extra_info"} <= set(schema.names)
    rows = read_verl_parquet(path)
    assert rows[0]["prompt"] == [{"role": "user", "content": "What is 2 plus 3?"}]
    assert rows[1]["reward_model"]["ground_truth"] == "Paris|Paris, France"
    assert rows[1]["extra_info"] == {"index": 1, "question": "Where was X born?", "answer": ["Paris", "Paris, France"],
                                     "problem_id": "m1", "split": "train"}
    assert rows[0]["ability"] == "code" and rows[1]["ability"] == "qa"
    code_response = "<think>add</think><code>```py\nprint(2+3)\n```</code>\n<observation>\n5\n</observation>\n\n<answer>5</answer>"
    assert compute_score(rows[0]["data_source"], code_response, rows[0]["reward_model"]["ground_truth"],
                         rows[0]["extra_info"]) == 1.0
    assert compute_score(rows[1]["data_source"], "<answer>paris, france</answer>",
                         rows[1]["reward_model"]["ground_truth"], rows[1]["extra_info"]) == 1.0
    assert compute_score(rows[1]["data_source"], "<answer>Lyon</answer>", rows[1]["reward_model"]["ground_truth"]) == 0.0
    assert not list(path.parent.glob(".*.tmp"))

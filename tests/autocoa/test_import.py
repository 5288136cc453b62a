"""Importers of AutoCoA's released formats on small files written here: the pair format (sharegpt ranking: mapping,
case detection, tokenization as plain text) and the CoA/CoT message files (-> valid trajectories), with errors
that name file and line.

    .venv/bin/python -m pytest tests/autocoa/test_import.py -q
"""
from __future__ import annotations

import json

import pytest

from typer.testing import CliRunner

from cli.app import app
from distill.autocoa_import import import_autocoa_messages, import_autocoa_pairs
from distill.autocoa_pairs import PairFormatError, pair_examples, read_pairs
from models.format import TrajectoryError, read_jsonl
from models.tokenizer import encode_trajectory
from training.sft_data import IGNORE_INDEX

PROMPT = "Answer the question. Question: Who directed Zarno?\n<think>\nI do not know the director of Zarno."
ACT = " Let me search.\n<begin_search> Zarno director </end_search>"
HALLUCINATE = " It was Kell Brin.\n</think>\n\n\\boxed{Kell Brin}"


def _row(chosen: str, rejected: str, **extra) -> dict:
    return {"conversation": [{"from": "human", "value": PROMPT}], "chosen": {"from": "gpt", "value": chosen},
            "rejected": {"from": "gpt", "value": rejected}, **extra}


def test_json_array_and_jsonl_import_the_same_pairs(tmp_path, tokenizer):
    rows = [_row(ACT, HALLUCINATE), _row(HALLUCINATE, ACT), _row(HALLUCINATE, " It was Tovo.</think>\\boxed{Tovo}")]
    as_json = tmp_path / "pairs.json"
    as_json.write_text(json.dumps(rows, indent=1))
    as_jsonl = tmp_path / "pairs.jsonl"
    as_jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = import_autocoa_pairs(as_json)
    assert [(p.question, p.prefix, p.chosen, p.rejected, p.tags) for p in pairs] == \
        [(PROMPT, "", r["chosen"]["value"], r["rejected"]["value"], "plain") for r in rows]
    assert [p.case for p in pairs] == ["info_missing", "info_present", ""]
    assert [p.id for p in pairs] == ["pairs-0", "pairs-1", "pairs-2"]
    assert [(p.chosen, p.case) for p in import_autocoa_pairs(as_jsonl)] == [(p.chosen, p.case) for p in pairs]
    chosen, _ = pair_examples(tokenizer, pairs[0])
    # their tags stay text: the labelled ids decode back to exactly the continuation
    assert tokenizer.decode([t for t in chosen.labels if t != IGNORE_INDEX]) == ACT


@pytest.mark.parametrize("bad, message", [
    ({"chosen": {"from": "gpt", "value": ACT}, "rejected": {"from": "gpt", "value": ACT}}, "'conversation' .* \\(missing\\)"),
    ({**_row(ACT, HALLUCINATE), "conversation": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]},
     "exactly one human turn \\(2 turns\\)"),
    (_row(ACT, ""), "'rejected' has an empty value"),
    ({**_row(ACT, HALLUCINATE), "chosen": {"from": "human", "value": ACT}}, "'chosen' must be \\{'from': 'gpt'"),
    (_row(ACT, HALLUCINATE, system="You are helpful."), "'system' prompt is not supported"),
    ([1, 2], "must be a JSON object"),
])
def test_bad_rows_name_file_and_line(tmp_path, bad, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_row(ACT, HALLUCINATE)) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(PairFormatError, match=f"^{path}:3: .*{message}"):
        import_autocoa_pairs(path)


def test_broken_json_names_the_line_and_array_records_their_index(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(_row(ACT, HALLUCINATE)) + "\n{not json\n")
    with pytest.raises(PairFormatError, match=f"^{path}:2: not valid JSON"):
        import_autocoa_pairs(path)
    array = tmp_path / "broken.json"
    array.write_text(json.dumps([_row(ACT, HALLUCINATE), _row(ACT, "  ")]))
    with pytest.raises(PairFormatError, match=f"^{array}: record 1: 'rejected' has an empty value"):
        import_autocoa_pairs(array)


# ---------------------------------------------------------------- CoA / CoT message files

COA = ("Okay, I need the director of Zarno.\n<begin_search> Zarno director </end_search>\n\n"
       "<search_result> (1) Zarno is a 1987 film directed by Kell Brin. </search_result>\n\n"
       "So it was Kell Brin. Check his birth year too.<begin_search> Kell Brin </end_search>\n\n"
       "<search_result> Retrevial failed. </search_result>\n\n"
       "Enough.\n</think>\n\nThe director is \\boxed{Kell Brin}.")
COT = "Zarno is well known; Kell Brin directed it.\n</think>\n\n\\boxed{Kell Brin}"


def _message_row(response: str, *extra: dict) -> dict:
    return {"messages": [*extra, {"role": "user", "content": PROMPT}, {"role": "assistant", "content": response}]}


def test_coa_and_cot_messages_become_valid_trajectories(tmp_path, tokenizer):
    path = tmp_path / "coa.json"
    path.write_text(json.dumps([_message_row(COA), _message_row("<think>\n" + COT)]))
    coa, cot = import_autocoa_messages(path)  # validated trajectories
    assert [(s.tag, s.text) for s in coa.segments] == [
        ("think", "Okay, I need the director of Zarno."), ("wiki_search", "Zarno director"),
        ("observation", "(1) Zarno is a 1987 film directed by Kell Brin."),
        ("think", "So it was Kell Brin. Check his birth year too."), ("wiki_search", "Kell Brin"),
        ("observation", "Retrevial failed."), ("think", "Enough."), ("answer", "Kell Brin")]
    assert coa.question == PROMPT and coa.answer == "Kell Brin" and coa.id == "coa-0"
    assert coa.metadata["tool_calls"] == 2 and not coa.metadata["cot_only"]
    assert coa.metadata["final_text"] == "The director is \\boxed{Kell Brin}."
    assert [s.tag for s in cot.segments] == ["think", "answer"] and cot.metadata["cot_only"]
    encoded = encode_trajectory(tokenizer, coa)  # the SFT encoding: observations masked, the rest learned
    assert 0 < sum(encoded.loss_mask) < len(encoded.input_ids)
    web = import_autocoa_messages(path, limit=1, search_tag="web_search")
    assert len(web) == 1 and web[0].segments[1].tag == "web_search"


@pytest.mark.parametrize("response, extra, message", [
    ("no think end \\boxed{x}", (), "no </think>"),
    ("reasoning </think> the answer is x", (), r"no \\boxed\{\.\.\.\} answer"),
    ("<begin_search> q </end_search> then nothing </think> \\boxed{x}", (), "search 'q' has no <search_result>"),
    ("<search_result> orphan </search_result> </think> \\boxed{x}", (), "unbalanced AutoCoA tag <search_result>"),
    ("I think <answer>x</answer> </think> \\boxed{x}", (), "nested tag <answer>"),
    (COT, ({"role": "system", "content": "You are helpful."},), "one user and one assistant message"),
])
def test_bad_message_rows_name_file_and_line(tmp_path, response, extra, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_message_row(COT)) + "\n" + json.dumps(_message_row(response, *extra)) + "\n")
    with pytest.raises(TrajectoryError, match=f"^{path}:2: .*{message}"):
        import_autocoa_messages(path)
    array = tmp_path / "bad.json"
    array.write_text(json.dumps([_message_row(COT), _message_row(response, *extra)]))
    with pytest.raises(TrajectoryError, match=f"^{array}: record 1: "):
        import_autocoa_messages(array)


def test_cli_import_writes_what_the_sft_trainer_reads_and_names_a_bad_row(tmp_path):
    src = tmp_path / "autocoa_pairs.json"
    src.write_text(json.dumps([_row(ACT, HALLUCINATE), _row(HALLUCINATE, ACT)]))
    out = tmp_path / "pairs.jsonl"
    result = CliRunner().invoke(app, ["import-autocoa", str(src), str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 2 pairs" in result.output and "sft.objective=pairwise" in result.output
    assert [(p.chosen, p.case) for p in read_pairs(out)] == [(ACT, "info_missing"), (HALLUCINATE, "info_present")]

    messages = tmp_path / "coa.jsonl"
    messages.write_text(json.dumps(_message_row(COA)) + "\n")
    result = CliRunner().invoke(app, ["import-autocoa", str(messages), str(tmp_path / "coa_ours.jsonl"),
                                      "--kind", "messages"])
    assert result.exit_code == 0, result.output
    [traj] = list(read_jsonl(tmp_path / "coa_ours.jsonl"))
    assert traj.answer == "Kell Brin" and "wiki_search" in [s.tag for s in traj.segments]

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_row(ACT, HALLUCINATE)) + "\n" + json.dumps({"conversation": []}) + "\n")
    result = CliRunner().invoke(app, ["import-autocoa", str(bad), str(tmp_path / "x.jsonl")])
    assert result.exit_code == 2 and str(bad) in result.output, result.output
    assert not (tmp_path / "x.jsonl").exists()

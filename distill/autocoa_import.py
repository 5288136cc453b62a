"""Import AutoCoA's released data: when-to-act pairs (LLaMA-Factory "sharegpt ranking") as our `PairRecord`s, and
CoA/CoT message files as our `Trajectory`s.

Their row:
    {"conversation": [{"from": "human", "value": "<prompt + shared reasoning prefix>"}],
     "chosen": {"from": "gpt", "value": "<continuation>"}, "rejected": {"from": "gpt", "value": "<continuation>"}}
(LLaMA-Factory's default column name `conversations` is accepted too.) The file is a JSON array (.json, as
LLaMA-Factory reads it) or one row per line (JSONL).

Mapping: LLaMA-Factory puts the human value, shared prefix included, in the user turn and learns only the gpt
continuation, so the import does the same: `question` = the human value, `prefix` = "", `tags` = "plain" (their
`<begin_search>`/`<search_result>` tags are text to our tokenizer, as they were to theirs). `case` is read off the
continuations: chosen calls search -> info_missing, rejected calls search -> info_present, neither -> "".

Rows the mapping cannot represent (several turns, a system prompt, an empty continuation) raise
`PairFormatError` naming the file and the line (JSONL) or the record index (JSON array).

Also AutoCoA's CoA and CoT message files (SFT stages 2 and 3; their LLaMA-Factory dataset `chain_of_action`,
sharegpt with role/content tags):
    {"messages": [{"role": "user", "content": "<prompt>"},
                  {"role": "assistant", "content": "reasoning <begin_search> q </end_search>\n\n<search_result> ...
                   </search_result>\n\n more reasoning </think>\n\nfinal text \\boxed{answer}"}]}
(their chat template writes the opening `<think>` after the user turn; a leading one in the content is accepted).
These become OUR trajectories, so the SFT trainer reads them unchanged: each reasoning stretch -> `<think>`, each
search -> `<wiki_search>` (their retriever is Wikipedia; AFM's MHQA tag; `search_tag` picks another), its result
-> `<observation>`, the last `\\boxed{}` after `</think>` -> `<answer>`. The text after `</think>` is kept in
`metadata["final_text"]` only. A CoT row (no search) becomes think + answer. A row without `</think>`, without a
boxed answer, with a search that has no result, with stray AutoCoA tags or with other than one user and one
assistant message raises TrajectoryError naming file and line (or record).

Usage:
    pairs = import_autocoa_pairs("autocoa_pairs.json")
    write_pairs("pairs.jsonl", pairs)        # distill/autocoa_pairs.py
    trajectories = import_autocoa_messages("coa_train.json")
    write_jsonl("train.jsonl", trajectories)  # models/format.py
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

from distill.autocoa_pairs import PairFormatError, PairRecord
from models.format import Segment, Trajectory, TrajectoryError, validate_trajectory
from problems.loaders import last_boxed

SEARCH_OPEN = "<begin_search>"  # AutoCoA's action tag (coa-facts.md, "AutoCoA")


def _rows(path: Path, error: type[ValueError] = PairFormatError) -> Iterator[tuple[str, Any]]:
    """(where, row) for each record: where = "file:line" (JSONL) or "file: record i" (JSON array). Broken JSON
    raises `error` naming the line."""
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise error(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from exc
        for i, row in enumerate(rows):
            yield f"{path}: record {i}", row
        return
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield f"{path}:{lineno}", json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{path}:{lineno}: not valid JSON: {exc.msg}") from exc


def _turn_value(turn: Any, role: str, what: str, where: str) -> str:
    if not isinstance(turn, dict) or turn.get("from") != role or not isinstance(turn.get("value"), str):
        raise PairFormatError(f"{where}: {what} must be {{'from': '{role}', 'value': <text>}}, got {str(turn)[:80]}")
    if not turn["value"].strip():
        raise PairFormatError(f"{where}: {what} has an empty value")
    return turn["value"]


def autocoa_row_to_pair(row: Any, row_id: str, where: str) -> PairRecord:
    """One sharegpt-ranking row -> PairRecord; PairFormatError (prefixed with `where`) if it does not fit."""
    if not isinstance(row, dict):
        raise PairFormatError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
    if row.get("system"):
        raise PairFormatError(f"{where}: a 'system' prompt is not supported (pairs take the configured one)")
    conversation = row.get("conversation", row.get("conversations"))
    if not isinstance(conversation, list) or len(conversation) != 1:
        found = "missing" if conversation is None else f"{len(conversation)} turns" if isinstance(conversation, list) \
            else type(conversation).__name__
        raise PairFormatError(f"{where}: 'conversation' must be a list of exactly one human turn ({found})")
    question = _turn_value(conversation[0], "human", "conversation[0]", where)
    chosen = _turn_value(row.get("chosen"), "gpt", "'chosen'", where)
    rejected = _turn_value(row.get("rejected"), "gpt", "'rejected'", where)
    chosen_acts, rejected_acts = SEARCH_OPEN in chosen, SEARCH_OPEN in rejected
    case = "info_missing" if chosen_acts and not rejected_acts else "info_present" if rejected_acts and not chosen_acts else ""
    return PairRecord(row_id, question, "", chosen, rejected, case, "plain", {"source": "autocoa", "where": where})


def import_autocoa_pairs(path: str | Path, limit: int | None = None) -> list[PairRecord]:
    """Every row of an AutoCoA pair file (JSON array or JSONL) as a PairRecord; ids are `<file stem>-<index>`."""
    path = Path(path)
    pairs: list[PairRecord] = []
    for where, row in _rows(path):
        if limit is not None and len(pairs) >= limit:
            break
        pairs.append(autocoa_row_to_pair(row, f"{path.stem}-{len(pairs)}", where))
    return pairs


# ---------------------------------------------------------------- CoA / CoT message files (SFT stages 2 and 3)

_SEARCH = re.compile(r"<begin_search>(.*?)</end_search>\s*(?:<search_result>(.*?)</search_result>)?", re.S)


def _messages(row: Any, where: str) -> tuple[str, str]:
    """(user content, assistant content) of a `messages` row; TrajectoryError if it is not exactly that."""
    messages = row.get("messages") if isinstance(row, dict) else None
    if not isinstance(messages, list) or [m.get("role") if isinstance(m, dict) else None for m in messages] \
            != ["user", "assistant"]:
        roles = [m.get("role") for m in messages if isinstance(m, dict)] if isinstance(messages, list) else messages
        raise TrajectoryError(f"{where}: 'messages' must be one user and one assistant message, got {str(roles)[:80]} "
                              "(a system message is not supported: trajectories take the configured prompt)")
    texts = [m.get("content") for m in messages]
    if not all(isinstance(t, str) and t.strip() for t in texts):
        raise TrajectoryError(f"{where}: every message needs a non-empty string 'content'")
    return texts[0], texts[1]


def autocoa_messages_to_trajectory(row: Any, row_id: str, where: str, search_tag: str = "wiki_search",
                                   family: str = "autocoa") -> Trajectory:
    """One message row -> a valid Trajectory; TrajectoryError (prefixed with `where`) if it does not fit."""
    question, response = _messages(row, where)
    body = response.strip().removeprefix("<think>")  # their template writes the opening <think> into the prompt
    if "</think>" not in body:
        raise TrajectoryError(f"{where}: the assistant message has no </think> (reasoning and answer are not separated)")
    reasoning, _, final = body.partition("</think>")
    answer = last_boxed(final)
    if answer is None:
        raise TrajectoryError(f"{where}: no \\boxed{{...}} answer after </think>")
    segments, pos = [], 0
    for m in _SEARCH.finditer(reasoning):
        if m.group(2) is None:
            raise TrajectoryError(f"{where}: search {m.group(1).strip()!r} has no <search_result> after it")
        segments += [Segment("think", reasoning[pos:m.start()].strip()), Segment(search_tag, m.group(1).strip()),
                     Segment("observation", m.group(2).strip())]
        pos = m.end()
    segments += [Segment("think", reasoning[pos:].strip()), Segment("answer", answer)]
    segments = [s for s in segments if s.text or s.tag == "observation"]  # no empty thought between searches
    leftover = re.search(r"</?(begin_search|end_search|search_result)>", "".join(s.text for s in segments if s.tag == "think"))
    if leftover:
        raise TrajectoryError(f"{where}: unbalanced AutoCoA tag {leftover.group(0)} in the reasoning")
    traj = Trajectory(id=row_id, question=question, family=family, segments=segments, answer=answer,
                      metadata={"source": "autocoa", "where": where, "tool_calls": len(_SEARCH.findall(reasoning)),
                                "cot_only": not _SEARCH.search(reasoning), "final_text": final.strip()})
    try:
        validate_trajectory(traj)
    except TrajectoryError as exc:
        raise TrajectoryError(f"{where}: {exc}") from exc
    return traj


def import_autocoa_messages(path: str | Path, limit: int | None = None, search_tag: str = "wiki_search",
                            family: str = "autocoa") -> list[Trajectory]:
    """Every row of an AutoCoA CoA or CoT message file (JSON array or JSONL) as a Trajectory; ids are
    `<file stem>-<index>`."""
    path = Path(path)
    out: list[Trajectory] = []
    for where, row in _rows(path, TrajectoryError):
        if limit is not None and len(out) >= limit:
            break
        out.append(autocoa_messages_to_trajectory(row, f"{path.stem}-{len(out)}", where, search_tag, family))
    return out

"""Import AutoCoA's released when-to-act pairs (LLaMA-Factory "sharegpt ranking") as our `PairRecord`s.

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

Usage:
    pairs = import_autocoa_pairs("autocoa_pairs.json")
    write_pairs("pairs.jsonl", pairs)        # distill/autocoa_pairs.py
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from distill.autocoa_pairs import PairFormatError, PairRecord

SEARCH_OPEN = "<begin_search>"  # AutoCoA's action tag (coa-facts.md, "AutoCoA")


def _rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, row) for each record: where = "file:line" (JSONL) or "file: record i" (JSON array)."""
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PairFormatError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from exc
        for i, row in enumerate(rows):
            yield f"{path}: record {i}", row
        return
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield f"{path}:{lineno}", json.loads(line)
        except json.JSONDecodeError as exc:
            raise PairFormatError(f"{path}:{lineno}: not valid JSON: {exc.msg}") from exc


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

"""Load public QA/math datasets (and our own Problem JSONL) from a local path or `s3://` into Problems.

Formats (sniffed from the file when `fmt` is None):
    hotpotqa  JSON list of {_id, question, answer, supporting_facts, context, type, level}
    gsm8k     JSONL {question, answer} where `answer` ends with "#### 42"
    afm_qa    AFM raw QA JSONL {question, answer: [...], data_source}
    verl      AFM/verl RL rows {data_source, prompt: [{role, content}], reward_model: {ground_truth}, extra_info}
    math      MATH-style {problem, answer} or {problem, solution} with the answer in the last \\boxed{...}
    problems  our Problem JSONL (problems.records)
JSONL-shaped formats may also come as Parquet (`.parquet`, read in batches with pyarrow).

A malformed row is never dropped silently: it becomes an error naming the file and line (JSON arrays: item;
Parquet: row), what is wrong and what to do, collected in `LoadReport.errors`; `strict=True` raises on the first.

Usage:
    report = load_problems("s3://datasets/gsm8k/test.jsonl", split="test", limit=500)
    if report.errors: print("\\n".join(report.errors))
    problems = report.problems
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from problems.records import Problem, ProblemFormatError

FORMATS = ("hotpotqa", "gsm8k", "afm_qa", "verl", "math", "problems")


@dataclass
class LoadReport:
    """What a load produced: the problems, and one message per row that could not be read."""

    source: str
    fmt: str
    problems: list[Problem] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class RowError(ValueError):
    """One row that does not fit its format; the loader adds file and line."""


def _text(row: dict, key: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise RowError(f"field '{key}' is missing or not a non-empty string (got {type(value).__name__})")
    return value.strip()


def _answers(value: Any, key: str) -> list[str]:
    if isinstance(value, (str, int, float)) and str(value).strip():
        return [str(value).strip()]
    if isinstance(value, list) and value and all(isinstance(v, (str, int, float)) and str(v).strip() for v in value):
        return [str(v).strip() for v in value]
    raise RowError(f"field '{key}' must be a non-empty string or list of strings (got {value!r:.80})")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j].strip() or None
    return None


def _hotpotqa(row: dict, rid: str, split: str) -> Problem:
    meta = {k: row[k] for k in ("type", "level", "supporting_facts", "context") if k in row}
    return Problem(id=str(row.get("_id") or rid), question=_text(row, "question"),
                   answers=_answers(row.get("answer"), "answer"), family="hotpotqa", split=split,
                   source="hotpotqa", metadata=meta)


def _gsm8k(row: dict, rid: str, split: str) -> Problem:
    answer = _text(row, "answer")
    if "####" not in answer:
        raise RowError("field 'answer' has no final '#### <number>' line (GSM8K answers end with '#### 42')")
    reasoning, final = answer.rsplit("####", 1)
    final = final.strip().replace(",", "")
    if not final:
        raise RowError("field 'answer' has nothing after '####'")
    return Problem(id=str(row.get("id") or rid), question=_text(row, "question"), answers=[final], family="gsm8k",
                   split=split, source="gsm8k", metadata={"solution": reasoning.strip()})


def _afm_qa(row: dict, rid: str, split: str) -> Problem:
    return Problem(id=str(row.get("id") or rid), question=_text(row, "question"),
                   answers=_answers(row.get("answer"), "answer"), family="afm_qa", split=split,
                   source=str(row.get("data_source") or "afm_qa"))


def _verl(row: dict, rid: str, split: str) -> Problem:
    reward = row.get("reward_model")
    if not isinstance(reward, dict) or "ground_truth" not in reward:
        raise RowError("field 'reward_model.ground_truth' is missing (verl rows carry the answer there)")
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    question = extra.get("question")
    if not question:
        prompt = row.get("prompt")
        if not isinstance(prompt, list) or not prompt or not isinstance(prompt[-1], dict):
            raise RowError("neither 'extra_info.question' nor a 'prompt' message list with content is present")
        question = prompt[-1].get("content")
    if not isinstance(question, str) or not question.strip():
        raise RowError("the question (extra_info.question or the last prompt message) is empty")
    truth = reward["ground_truth"]
    if isinstance(truth, str) and "|" in truth:  # AFM writes several accepted answers separated by "|"
        truth = truth.split("|")
    return Problem(id=str(extra.get("index", rid)), question=question.strip(), answers=_answers(truth, "ground_truth"),
                   family="afm_qa", split=split, source=str(row.get("data_source") or "verl"))


def _math(row: dict, rid: str, split: str) -> Problem:
    answer = row.get("answer")
    if answer in (None, "") and isinstance(row.get("solution"), str):
        answer = last_boxed(row["solution"])
        if answer is None:
            raise RowError("no 'answer' field and 'solution' has no \\boxed{...}; add the answer to the row")
    meta = {k: row[k] for k in ("level", "type", "subject", "solution") if k in row}
    return Problem(id=str(row.get("unique_id") or row.get("id") or rid), question=_text(row, "problem"),
                   answers=_answers(answer, "answer"), family="math", split=split, source="math", metadata=meta)


def _problem(row: dict, rid: str, split: str) -> Problem:
    try:
        problem = Problem.from_dict(row)
    except (KeyError, TypeError) as exc:
        raise RowError(f"not a Problem record (missing {exc}); rows need id, question, answers, family") from None
    _text(row, "question")
    _answers(problem.answers, "answers")
    return problem


_CONVERTERS: dict[str, Callable[[dict, str, str], Problem]] = {
    "hotpotqa": _hotpotqa, "gsm8k": _gsm8k, "afm_qa": _afm_qa, "verl": _verl, "math": _math, "problems": _problem,
}


def sniff_format(row: dict) -> str | None:
    """The format a row looks like, from its keys; None if it fits none."""
    keys = set(row)
    if {"id", "question", "answers", "family"} <= keys:
        return "problems"
    if "supporting_facts" in keys or ("_id" in keys and "context" in keys):
        return "hotpotqa"
    if "reward_model" in keys:
        return "verl"
    if "problem" in keys and keys & {"answer", "solution"}:
        return "math"
    if {"question", "answer"} <= keys:
        if isinstance(row["answer"], str) and "####" in row["answer"]:
            return "gsm8k"
        return "afm_qa"
    return None


def iter_rows(path: Path, where: str) -> Iterator[tuple[str, Any]]:
    """(location, row) pairs from JSONL, a JSON array or Parquet; a row that is not even JSON comes back as a
    RowError in place of the row, so callers report it with its location."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        index = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                index += 1
                yield f"{where}: row {index}", row
        return
    with open(path, encoding="utf-8") as f:
        first = f.read(1)
        while first and first.isspace():
            first = f.read(1)
        f.seek(0)
        if first == "[":
            try:
                items = json.load(f)
            except json.JSONDecodeError as exc:
                yield f"{where}:{exc.lineno}", RowError(f"the JSON array does not parse ({exc.msg}); fix the file")
                return
            for i, item in enumerate(items):
                yield f"{where}: item {i}", item
            return
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield f"{where}:{lineno}", json.loads(line)
            except json.JSONDecodeError as exc:
                yield f"{where}:{lineno}", RowError(f"not valid JSON ({exc.msg}); each line must be one JSON object")


def _local_copy(path_or_uri: str | Path, tmp: Path) -> Path:
    """A local file for `path_or_uri`; `s3://bucket/dir/file` is downloaded into `tmp` through the artifact store."""
    text = str(path_or_uri)
    if not text.startswith("s3://"):
        path = Path(text.removeprefix("file://"))
        if not path.is_file():
            raise FileNotFoundError(f"{text}: no such file; pass a local file path or an s3://bucket/key URI")
        return path
    from afm.storage import open_store

    store_uri, _, key = text.rpartition("/")
    if store_uri == "s3:/" or not key:
        raise ValueError(f"{text}: expected s3://bucket/key (a file, not a bucket)")
    local = tmp / key
    open_store(store_uri).download_file(key, local)
    return local


def load_problems(path_or_uri: str | Path, fmt: str | None = None, split: str = "test", limit: int | None = None,
                  strict: bool = False) -> LoadReport:
    """Read up to `limit` problems; `fmt` None sniffs it from the first row. Bad rows go to `errors`
    (`strict`: raise ProblemFormatError on the first)."""
    if fmt is not None and fmt not in FORMATS:
        raise ValueError(f"load_problems: fmt {fmt!r} is not one of {FORMATS}")
    where = str(path_or_uri)
    with tempfile.TemporaryDirectory(prefix="afm-load-") as tmp:
        path = _local_copy(path_or_uri, Path(tmp))
        report = LoadReport(source=where, fmt=fmt or "")
        stem = Path(where).stem
        for location, row in iter_rows(path, where):
            if limit is not None and len(report.problems) >= limit:
                break
            try:
                if isinstance(row, RowError):
                    raise row
                if not isinstance(row, dict):
                    raise RowError(f"a row must be a JSON object, got {type(row).__name__}")
                if not report.fmt:
                    report.fmt = sniff_format(row) or ""
                    if not report.fmt:
                        raise ProblemFormatError(f"{location}: cannot tell the format from fields "
                                                 f"{sorted(row)[:8]}; pass fmt= one of {FORMATS}")
                rid = f"{stem}-{location.rsplit(':', 1)[-1].strip().replace(' ', '')}"
                report.problems.append(_CONVERTERS[report.fmt](row, rid, split))
            except RowError as exc:
                message = f"{location}: {exc} [format {report.fmt or '?'}]"
                if strict:
                    raise ProblemFormatError(message) from None
                report.errors.append(message)
    return report


def hotpotqa_corpus(problems: list[Problem]) -> list[dict]:
    """Search documents `{id, title, url, text}` from HotpotQA problems' context paragraphs (deduplicated by
    title), with mini-web URLs, so the distractor setting runs against the local search and crawl tools."""
    docs: dict[str, dict] = {}
    for problem in problems:
        for title, sentences in problem.metadata.get("context", []):
            if title not in docs:
                slug = title.replace(" ", "_")
                docs[title] = {"id": f"hotpotqa-{slug}", "title": title, "url": f"http://miniweb.local/wiki/{slug}",
                               "text": " ".join(s.strip() for s in sentences)}
    return list(docs.values())

"""Rewards for agentic RL: what the learner gets for one episode, as the AFM release scores.

Correctness is not decided here: `training.scoring` is the one grader that the RL reward, evaluation
(`evaluation.grading`) and verl's `compute_score` share (same answer extraction, same per-family rules and size
limits, code run against its tests). This module turns its verdict into a reward:
- web / QA judged families (`web`, `afm_qa`, `miniweb`, ...) and multi-hop QA (`multihop`, `hotpotqa`, ...):
  the grader's 0/1 verdict (the configured judge; offline, SQuAD-normalized exact match, AutoCoA's HotpotQA
  reward). Multi-hop QA may instead be rewarded with token F1 (`qa_metric="f1"`: partial credit for a
  half-right name, a denser signal for small policies); `correct` (the accuracy) stays the verdict.
- code / math (`computation`, `math`, `gsm8k`, `humaneval`, ...): verdict x format_score, both 0/1. format_score
  needs balanced, non-nested tags, non-empty tool calls, exactly one ```py / ```python block per `<code>` that
  `ast` parses, and one final non-empty `<answer>`.
- optional DAPO soft overlong penalty added on top (`overlong_penalty`).
`RewardBreakdown.reason` says why an answer was wrong (the grader's rationale: tests failed, answer too long for
its family, no answer, ...).

What the model wrote vs. what tools returned: the reward is computed on MODEL text only. Rollouts pass the
concatenation of the generated turns (`Episode.model_text`), so an `<answer>` or tags injected by a web page
or program output can never count. For the verl entry point `compute_score`, which receives the decoded
response with observations inside, observation blocks are cut out first; that does NOT cover an observation
that itself contains the literal closing `</observation>` text followed by forged tags (a text-only scorer
cannot tell them apart) — our rollouts avoid the issue by scoring `model_text`.

Usage:
    judge = NormalizedMatchJudge()
    r = score_response("multihop", model_text, ["Paris"], judge)      # RewardBreakdown(score, answer, ...)
    r = score_response("humaneval", model_text, problem.answers, judge, tests=problem.metadata,
                       test_limits=SandboxLimits(timeout_s=10))         # the code runs against the tests
    compute_score("computation", solution_str, "42")                  # verl-compatible float
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from agents.tools.sandbox import SandboxLimits
from models.format import OBSERVATION_CLOSE, OBSERVATION_OPEN, TAGS, TOOL_TAGS
from training.scoring import (  # noqa: F401  normalize_answer: re-exported for evaluation.report
    DEFAULT_SCORING, Judge, JudgeResult, NormalizedMatchJudge, ScoringConfig, extract_prediction, grade, inadmissible,
    normalize_answer, reward_kind, token_f1,
)

_TAG_RE = re.compile(r"<(/?)(" + "|".join(TAGS) + r")>")
_OBSERVATION_BLOCK_RE = re.compile(re.escape(OBSERVATION_OPEN) + r".*?" + re.escape(OBSERVATION_CLOSE), re.S)
_FENCE_RE = re.compile(r"```(?:py|python)[ \t]*\n(.*?)```", re.S)
_ANY_FENCE_RE = re.compile(r"```")


def strip_observations(response: str) -> str:
    """Cut rendered observation blocks out of a decoded response (see the module docstring for the limit)."""
    return _OBSERVATION_BLOCK_RE.sub("", response)


@dataclass
class FormatReport:
    ok: bool
    reason: str  # "" when ok; otherwise what is wrong, for logs


def check_format(model_text: str, cfg: ScoringConfig = DEFAULT_SCORING) -> FormatReport:
    """CoA format check on model-written text (observations already excluded).

    Requires: every known tag opened and closed in order with no nesting; no stray text between closing a
    tool call and the next tag is required (observations are not in this text); every tool call non-empty;
    every `<code>` holds exactly one ```py/```python block that `ast` parses; exactly one `<answer>`, last,
    non-empty. Does NOT check role-transition rules (models.format.ALLOWED_NEXT) — RL rewards outcomes.
    """
    if len(model_text) > cfg.max_scored_chars:
        return FormatReport(False, f"output longer than {cfg.max_scored_chars} chars")
    open_tag: str | None = None
    open_end = 0
    answers = 0
    last_close = ""
    for m in _TAG_RE.finditer(model_text):
        closing, tag = m.group(1) == "/", m.group(2)
        if tag == "observation":
            return FormatReport(False, "model wrote an <observation> tag itself")
        if not closing:
            if open_tag is not None:
                return FormatReport(False, f"<{tag}> nested inside <{open_tag}>")
            open_tag, open_end = tag, m.end()
            continue
        if open_tag != tag:
            return FormatReport(False, f"</{tag}> closes {'nothing' if open_tag is None else f'<{open_tag}>'}")
        body = model_text[open_end:m.start()]
        if tag in TOOL_TAGS and not body.strip():
            return FormatReport(False, f"empty <{tag}> call")
        if tag == "code":
            code_problem = _check_code_block(body, cfg.max_code_chars)
            if code_problem:
                return FormatReport(False, code_problem)
        if tag == "answer":
            answers += 1
            if not body.strip():
                return FormatReport(False, "empty <answer>")
        open_tag, last_close = None, tag
    if open_tag is not None:
        return FormatReport(False, f"<{open_tag}> never closed")
    if answers != 1:
        return FormatReport(False, f"{answers} <answer> segments (need exactly one)")
    if last_close != "answer":
        return FormatReport(False, f"<answer> is not last (last closed <{last_close}>)")
    return FormatReport(True, "")


def _check_code_block(body: str, max_chars: int) -> str:
    """'' if `body` holds exactly one parseable python fence and nothing but whitespace around it."""
    if len(body) > max_chars:
        return f"<code> longer than {max_chars} chars"
    blocks = _FENCE_RE.findall(body)
    if len(blocks) != 1 or len(_ANY_FENCE_RE.findall(body)) != 2:
        return f"<code> must hold exactly one ```py block (found {len(blocks)})"
    try:
        ast.parse(blocks[0])
    except (SyntaxError, ValueError) as exc:
        return f"<code> does not parse: {exc.__class__.__name__}: {exc}"
    return ""


# ---------------------------------------------------------------- judges

JUDGE_PROMPT = """You are grading an answer to a question against the golden answer(s).
Question: {question}
Golden answer(s): {golden}
Predicted answer: {prediction}

Is the predicted answer semantically equivalent to one of the golden answers? Minor formatting differences
are fine; extra or missing facts that change the answer are not.
Reply with JSON only: {{"rationale": "<one sentence>", "judgement": "correct" or "incorrect"}}"""

_JSON_OBJECT_RE = re.compile(r"\{.*\}", re.S)
_JUDGEMENT_RE = re.compile(r'"?judgement"?\s*[:=]\s*"?(correct|incorrect)', re.I)


def parse_judgement(reply: str) -> JudgeResult | None:
    """Read a judge reply: the first JSON object with a `judgement` field, else a `judgement: x` pattern;
    None if neither is present (the caller retries)."""
    match = _JSON_OBJECT_RE.search(reply)
    if match:
        try:
            data = json.loads(match.group(0))
            verdict = str(data.get("judgement", "")).strip().lower()
            if verdict in ("correct", "incorrect"):
                return JudgeResult(verdict == "correct", str(data.get("rationale", "")))
        except (json.JSONDecodeError, AttributeError):
            pass
    loose = _JUDGEMENT_RE.search(reply)
    if loose:
        return JudgeResult(loose.group(1).lower() == "correct", reply.strip()[:500])
    return None


class LLMJudge:
    """LLM-as-judge 0/1 (AFM web reward). `complete(messages) -> str` is any chat backend (an OpenAI-compatible
    client wrapped in a function, a Ray Serve handle, ...). Unparseable replies are retried `max_retries`
    times, then counted incorrect with the last reply as rationale (a reward must always be produced).

    `cache_dir`: every verdict is written there (one JSON file per (model, prompt), atomically), so a job that
    crashed and resumes, or a step that is re-run, does not pay for the same judge call twice. Safe to call from
    several threads (distinct files; a key judged twice at once is written twice, identically)."""

    def __init__(self, complete: Callable[[list[dict[str, str]]], str], max_retries: int = 3,
                 cache_dir: Path | None = None, model: str = ""):
        self.complete = complete
        self.max_retries = max_retries
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.model = model

    def judge(self, question: str, golden: list[str], prediction: str) -> JudgeResult:
        prompt = JUDGE_PROMPT.format(question=question, golden=" | ".join(golden), prediction=prediction)
        cached = self._cache_path(prompt)
        if cached is not None and cached.is_file():
            data = json.loads(cached.read_text())
            return JudgeResult(bool(data["correct"]), str(data["rationale"]))
        result = self._ask(prompt)
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_name(f".{cached.name}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps({"correct": result.correct, "rationale": result.rationale}))
            os.replace(tmp, cached)
        return result

    def _cache_path(self, prompt: str) -> Path | None:
        if self.cache_dir is None:
            return None
        key = hashlib.sha256(f"{self.model}\n{prompt}".encode()).hexdigest()
        return self.cache_dir / key[:2] / f"{key}.json"

    def _ask(self, prompt: str) -> JudgeResult:
        reply = ""
        for _ in range(self.max_retries + 1):
            reply = self.complete([{"role": "user", "content": prompt}])
            result = parse_judgement(reply)
            if result is not None:
                return result
        return JudgeResult(False, f"unparseable judge reply after {self.max_retries + 1} tries: {reply[:200]!r}")


# ---------------------------------------------------------------- scoring

@dataclass
class RewardBreakdown:
    score: float           # what the learner optimizes
    answer: str | None     # what was graded (the final answer; for HumanEval maybe the last <code>); None: none
    answer_score: float    # answer quality alone, 0..1 (token F1 under qa_metric="f1", else == correct)
    correct: float         # 1.0 if the grader's verdict is correct: the reported accuracy, as evaluation's
    format_score: float    # 1.0 if check_format passed
    format_reason: str
    overlong_penalty: float
    reason: str = ""       # the grader's rationale: why the answer is right or wrong


def overlong_penalty(response_tokens: int, max_tokens: int, buffer_tokens: int) -> float:
    """DAPO soft overlong punishment: 0 up to max - buffer, then linear down to -1 at max, -1 beyond."""
    if buffer_tokens <= 0 or response_tokens <= max_tokens - buffer_tokens:
        return 0.0 if response_tokens <= max_tokens else -1.0
    if response_tokens > max_tokens:
        return -1.0
    return (max_tokens - buffer_tokens - response_tokens) / buffer_tokens


def score_response(
    family: str,
    model_text: str,
    golden: str | list[str],
    judge: Judge,
    question: str = "",
    response_tokens: int = 0,
    overlong_max_tokens: int = 0,
    overlong_buffer_tokens: int = 0,
    qa_metric: Literal["em", "f1"] = "em",
    tests: Mapping[str, Any] | None = None,
    test_limits: SandboxLimits | None = None,
    cfg: ScoringConfig = DEFAULT_SCORING,
) -> RewardBreakdown:
    """Reward for one episode's MODEL-written text. `overlong_max_tokens=0` disables the overlong penalty.
    `tests` (a Problem's metadata: prompt, test, entry_point) is what test-run families (HumanEval) are graded
    with, each run bounded by `test_limits`; correctness is `training.scoring.grade`'s verdict."""
    prediction = extract_prediction(family, model_text, tests, cfg)
    verdict = grade(family, prediction, golden, judge, question, tests, test_limits, cfg)
    fmt = check_format(model_text, cfg)
    kind = reward_kind(family)
    correct = float(verdict.correct)
    # F1 only shapes the QA reward; what counts as right (the accuracy) stays the verdict.
    if kind == "qa_match" and qa_metric == "f1" and not inadmissible(family, prediction, cfg):
        answer_score = token_f1(prediction, golden, family)
    else:
        answer_score = correct
    score = answer_score * (1.0 if fmt.ok else 0.0) if kind in ("code", "tests") else answer_score
    penalty = overlong_penalty(response_tokens, overlong_max_tokens, overlong_buffer_tokens) if overlong_max_tokens else 0.0
    return RewardBreakdown(score + penalty, prediction, answer_score, correct, float(fmt.ok), fmt.reason, penalty,
                           verdict.rationale)


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    """verl `custom_reward_function` entry point; the same grader as RL and evaluation. `solution_str` is the
    decoded response (observations inside are cut out first). Golden alternatives: `extra_info["answer"]` when it
    is a list (what training.verl_export writes), else `ground_truth` (a list, or a string that is `|`-split for
    QA families only). `extra_info["tests"]` (prompt, test, entry_point) is what HumanEval rows are run against.
    Uses the offline normalized-match judge; verl users wanting an LLM judge wrap `score_response` with one."""
    info = extra_info or {}
    golden = _alternatives(info.get("answer")) or _alternatives(ground_truth) or str(ground_truth)
    return score_response(data_source, strip_observations(solution_str), golden, NormalizedMatchJudge(),
                          str(info.get("question") or ""), tests=info.get("tests")).score


def _alternatives(value: Any) -> list[str] | None:
    """A list-like of golden alternatives (list, tuple, or the numpy array a parquet list becomes) as strings;
    None for anything else (a string, a dict, None)."""
    if value is None or isinstance(value, (str, bytes, Mapping)):
        return None
    try:
        return [str(item) for item in value]
    except TypeError:
        return None


def build_judge(kind: str, base_url: str, model: str, cache_dir: Path | None = None) -> Judge:
    """The judge a config names: "normalized_match" (offline default) or "llm" (an OpenAI-compatible endpoint
    answering the JSON judge prompt; key from OPENAI_API_KEY; verdicts cached in `cache_dir` when given)."""
    if kind == "normalized_match":
        return NormalizedMatchJudge()
    if not (base_url and model):
        raise ValueError("judge='llm' needs fields 'judge_base_url' and 'judge_model'")
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "unused"))

    def complete(messages: list[dict[str, str]]) -> str:
        reply = client.chat.completions.create(model=model, messages=messages, temperature=0.0)
        return reply.choices[0].message.content or ""

    return LLMJudge(complete, cache_dir=cache_dir, model=model)

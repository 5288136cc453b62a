"""Rewards for agentic RL: pure functions from (model output, golden answers) to a float, as the AFM release scores.

Families and what they are scored with:
- web / QA (`web`, `afm_qa`, `miniweb`, ...): an LLM-as-judge 0/1 through the `Judge` interface. `LLMJudge`
  prompts a chat backend for JSON `{rationale, judgement: correct|incorrect}` with retries and tolerant parsing;
  `NormalizedMatchJudge` (SQuAD-normalized exact match) is the offline default.
- multi-hop QA (`multihop`, `hotpotqa`, `mhqa`, `wiki`): exact match (`qa_metric="em"`, AutoCoA's HotpotQA
  reward) or token F1 (`"f1"`: partial credit for a half-right name, a denser signal for small policies) after
  SQuAD normalization (lowercase, strip punctuation and articles, collapse whitespace); answers are split on
  `|`. `correct` (the accuracy) is exact match either way.
- code / math (`code`, `computation`, `math`, `gsm8k`, `humaneval`): answer_score x format_score, both 0/1;
  answer_score is a numeric/normalized match, or the problem's test cases when a `run_tests` is given (the
  trainer runs HumanEval's check program in the sandbox). format_score
  needs balanced, non-nested tags, non-empty tool calls, exactly one ```py / ```python block per `<code>` that
  `ast` parses, and one final non-empty `<answer>`.
- optional DAPO soft overlong penalty added on top (`overlong_penalty`).

What the model wrote vs. what tools returned: the reward is computed on MODEL text only. Rollouts pass the
concatenation of the generated turns (`Episode.model_text`), so an `<answer>` or tags injected by a web page
or program output can never count. For the verl entry point `compute_score`, which receives the decoded
response with observations inside, observation blocks are cut out first; that does NOT cover an observation
that itself contains the literal closing `</observation>` text followed by forged tags (a text-only scorer
cannot tell them apart) — our rollouts avoid the issue by scoring `model_text`.

Hostile outputs are bounded: text beyond `MAX_SCORED_CHARS` scores 0, answers beyond `MAX_ANSWER_CHARS` are
wrong, code blocks beyond `MAX_CODE_CHARS` fail the format check (ast on megabytes would stall the learner).

Usage:
    judge = NormalizedMatchJudge()
    r = score_response("multihop", model_text, ["Paris"], judge)      # RewardBreakdown(score, answer, ...)
    compute_score("computation", solution_str, "42")                  # verl-compatible float
"""
from __future__ import annotations

import os

import ast
import json
import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Literal, Protocol

from models.format import OBSERVATION_CLOSE, OBSERVATION_OPEN, TAGS, TOOL_TAGS

MAX_SCORED_CHARS = 200_000
MAX_ANSWER_CHARS = 2_000
MAX_CODE_CHARS = 20_000

QA_MATCH_FAMILIES = ("multihop", "hotpotqa", "mhqa", "wiki", "nq", "triviaqa", "2wiki", "musique")
CODE_FAMILIES = ("code", "computation", "math", "gsm8k", "humaneval", "aime")

_TAG_RE = re.compile(r"<(/?)(" + "|".join(TAGS) + r")>")
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.S)
_OBSERVATION_BLOCK_RE = re.compile(re.escape(OBSERVATION_OPEN) + r".*?" + re.escape(OBSERVATION_CLOSE), re.S)
_FENCE_RE = re.compile(r"```(?:py|python)[ \t]*\n(.*?)```", re.S)
_ANY_FENCE_RE = re.compile(r"```")
_BOXED_RE = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")


# ---------------------------------------------------------------- answer normalization and matching (SQuAD)

def normalize_answer(text: str) -> str:
    """SQuAD normalization: lowercase, drop punctuation, drop articles a/an/the, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def split_answers(answers: str | list[str]) -> list[str]:
    """Golden answers as a flat list: each string may hold alternatives separated by `|` (AFM convention)."""
    items = [answers] if isinstance(answers, str) else list(answers)
    return [part.strip() for item in items for part in str(item).split("|") if part.strip()]


def exact_match(prediction: str, golden: str | list[str]) -> float:
    """1.0 if the normalized prediction equals any normalized golden alternative, else 0.0."""
    pred = normalize_answer(prediction)
    return float(bool(pred) and any(pred == normalize_answer(g) for g in split_answers(golden)))


def token_f1(prediction: str, golden: str | list[str]) -> float:
    """Best SQuAD token-level F1 of the prediction against any golden alternative."""
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for gold in split_answers(golden):
        gold_tokens = normalize_answer(gold).split()
        common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
        if common == 0:
            continue
        precision, recall = common / len(pred_tokens), common / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def numeric_match(prediction: str, golden: str | list[str], rel_tol: float = 1e-6) -> float:
    """1.0 if the prediction parses as a number equal (within rel_tol) to a golden number, else exact match."""
    def as_number(s: str) -> float | None:
        try:
            return float(s.strip().replace(",", "").rstrip("."))
        except ValueError:
            return None

    pred = as_number(prediction)
    if pred is not None:
        for gold in split_answers(golden):
            value = as_number(gold)
            if value is not None and abs(pred - value) <= rel_tol * max(1.0, abs(value)):
                return 1.0
    return exact_match(prediction, golden)


# ---------------------------------------------------------------- reading the model's output

def strip_observations(response: str) -> str:
    """Cut rendered observation blocks out of a decoded response (see the module docstring for the limit)."""
    return _OBSERVATION_BLOCK_RE.sub("", response)


def extract_answer(model_text: str) -> str | None:
    """The text of the final `<answer>` the model wrote (a `\\boxed{}` inside wins), or None if there is none,
    it is empty, or it is longer than MAX_ANSWER_CHARS."""
    matches = _ANSWER_RE.findall(model_text[:MAX_SCORED_CHARS])
    if not matches:
        return None
    answer = matches[-1].strip()
    boxed = _BOXED_RE.findall(answer)
    if boxed:
        answer = boxed[-1].strip()
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return None
    return answer


@dataclass
class FormatReport:
    ok: bool
    reason: str  # "" when ok; otherwise what is wrong, for logs


def check_format(model_text: str) -> FormatReport:
    """CoA format check on model-written text (observations already excluded).

    Requires: every known tag opened and closed in order with no nesting; no stray text between closing a
    tool call and the next tag is required (observations are not in this text); every tool call non-empty;
    every `<code>` holds exactly one ```py/```python block that `ast` parses; exactly one `<answer>`, last,
    non-empty. Does NOT check role-transition rules (models.format.ALLOWED_NEXT) — RL rewards outcomes.
    """
    if len(model_text) > MAX_SCORED_CHARS:
        return FormatReport(False, f"output longer than {MAX_SCORED_CHARS} chars")
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
            code_problem = _check_code_block(body)
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


def _check_code_block(body: str) -> str:
    """'' if `body` holds exactly one parseable python fence and nothing but whitespace around it."""
    if len(body) > MAX_CODE_CHARS:
        return f"<code> longer than {MAX_CODE_CHARS} chars"
    blocks = _FENCE_RE.findall(body)
    if len(blocks) != 1 or len(_ANY_FENCE_RE.findall(body)) != 2:
        return f"<code> must hold exactly one ```py block (found {len(blocks)})"
    try:
        ast.parse(blocks[0])
    except (SyntaxError, ValueError) as exc:
        return f"<code> does not parse: {exc.__class__.__name__}: {exc}"
    return ""


# ---------------------------------------------------------------- judges

@dataclass
class JudgeResult:
    correct: bool
    rationale: str


class Judge(Protocol):
    def judge(self, question: str, golden: list[str], prediction: str) -> JudgeResult: ...


class NormalizedMatchJudge:
    """Offline judge: correct iff the SQuAD-normalized prediction equals a golden alternative."""

    def judge(self, question: str, golden: list[str], prediction: str) -> JudgeResult:
        correct = bool(exact_match(prediction, golden))
        return JudgeResult(correct, "normalized exact match" if correct else "no normalized match")


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
    times, then counted incorrect with the last reply as rationale (a reward must always be produced)."""

    def __init__(self, complete: Callable[[list[dict[str, str]]], str], max_retries: int = 3):
        self.complete = complete
        self.max_retries = max_retries

    def judge(self, question: str, golden: list[str], prediction: str) -> JudgeResult:
        prompt = JUDGE_PROMPT.format(question=question, golden=" | ".join(golden), prediction=prediction)
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
    answer: str | None     # extracted final answer (None: missing/empty/too long)
    answer_score: float    # answer quality alone, 0..1 (token F1 under qa_metric="f1", else == correct)
    correct: float         # 1.0 if the answer is right (EM / judge / numeric / tests): the reported accuracy
    format_score: float    # 1.0 if check_format passed
    format_reason: str
    overlong_penalty: float


def overlong_penalty(response_tokens: int, max_tokens: int, buffer_tokens: int) -> float:
    """DAPO soft overlong punishment: 0 up to max - buffer, then linear down to -1 at max, -1 beyond."""
    if buffer_tokens <= 0 or response_tokens <= max_tokens - buffer_tokens:
        return 0.0 if response_tokens <= max_tokens else -1.0
    if response_tokens > max_tokens:
        return -1.0
    return (max_tokens - buffer_tokens - response_tokens) / buffer_tokens


def reward_kind(family: str) -> str:
    """'qa_match' | 'code' | 'judge' for a problem family / verl data_source."""
    name = family.lower()
    if any(name.startswith(f) for f in QA_MATCH_FAMILIES):
        return "qa_match"
    if any(name.startswith(f) for f in CODE_FAMILIES):
        return "code"
    return "judge"


def score_response(
    family: str,
    model_text: str,
    golden: str | list[str],
    judge: Judge,
    question: str = "",
    response_tokens: int = 0,
    overlong_max_tokens: int = 0,
    overlong_buffer_tokens: int = 0,
    run_tests: Callable[[str], bool] | None = None,
    qa_metric: Literal["em", "f1"] = "em",
) -> RewardBreakdown:
    """Reward for one episode's MODEL-written text. `overlong_max_tokens=0` disables the overlong penalty.
    `run_tests(answer) -> passed` replaces answer matching for code problems judged by test cases (HumanEval)."""
    golden_list = split_answers(golden)
    answer = extract_answer(model_text)
    fmt = check_format(model_text)
    kind = reward_kind(family)
    if answer is None:
        correct = 0.0
    elif kind == "qa_match":
        correct = exact_match(answer, golden_list)
    elif kind == "code" and run_tests is not None:
        correct = float(run_tests(answer))
    elif kind == "code":
        correct = numeric_match(answer, golden_list)
    else:
        correct = float(judge.judge(question, golden_list, answer).correct)
    # F1 only shapes the QA reward; what counts as right (the accuracy) stays exact match.
    f1_reward = answer is not None and kind == "qa_match" and qa_metric == "f1"
    answer_score = token_f1(answer, golden_list) if f1_reward else correct
    score = answer_score * (1.0 if fmt.ok else 0.0) if kind == "code" else answer_score
    penalty = overlong_penalty(response_tokens, overlong_max_tokens, overlong_buffer_tokens) if overlong_max_tokens else 0.0
    return RewardBreakdown(score + penalty, answer, answer_score, correct, float(fmt.ok), fmt.reason, penalty)


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    """verl `custom_reward_function` entry point. `solution_str` is the decoded response (observations inside
    are cut out first); `ground_truth` a string (alternatives split on `|`) or a list. Uses the offline
    normalized-match judge for web data; verl users wanting an LLM judge wrap `score_response` with one."""
    question = (extra_info or {}).get("question", "")
    golden = list(ground_truth) if isinstance(ground_truth, (list, tuple)) else str(ground_truth)
    return score_response(data_source, strip_observations(solution_str), golden, NormalizedMatchJudge(), question).score


def build_judge(kind: str, base_url: str, model: str) -> Judge:
    """The judge a config names: "normalized_match" (offline default) or "llm" (an OpenAI-compatible endpoint
    answering the JSON judge prompt; key from OPENAI_API_KEY)."""
    if kind == "normalized_match":
        return NormalizedMatchJudge()
    if not (base_url and model):
        raise ValueError("judge='llm' needs fields 'judge_base_url' and 'judge_model'")
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "unused"))

    def complete(messages: list[dict[str, str]]) -> str:
        reply = client.chat.completions.create(model=model, messages=messages, temperature=0.0)
        return reply.choices[0].message.content or ""

    return LLMJudge(complete)

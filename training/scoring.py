"""One grader: what counts as a correct answer, for the RL reward, evaluation and verl alike.

`training.rewards.score_response` (the RL reward), `evaluation.grading.grade_prediction` (eval records) and
`training.rewards.compute_score` (verl's reward entry point) all decide correctness here, in the same steps:

1. Extraction (`extract_prediction`): the final `<answer>` the model wrote; a `\\boxed{}` inside it wins, except
   for programs. For families scored by tests (HumanEval) the answer keeps its indentation (a function body is
   HumanEval's own convention), and when it is not code (the model ran its function in `<code>` and stated the
   result in words) the last `<code>` call the model wrote is what gets tested.
2. Admission (`inadmissible`): a missing or blank answer, or one longer than its family's limit
   (`ScoringConfig`), is wrong with a reason that says so, never a silent 0.
3. The family's rule (`reward_kind`):
   - "tests" (humaneval): the code runs against the problem's tests in the sandbox
     (`problems.humaneval.humaneval_check_program`); correct iff the program exits 0. Code is never compared
     as text: a correct solution that differs from the reference passes.
   - "code" (computation, math, gsm8k, aime): numeric match, else SQuAD-normalized match.
   - "qa_match" (multihop, hotpotqa, ...) and "judge" (web, afm_qa, ...): the configured `Judge`
     (`NormalizedMatchJudge`, SQuAD exact match, offline; an LLM judge when one is configured).
Golden answers: QA alternatives may be joined with `|` (AFM convention) and are split; code and math goldens
are never split (`|` is Python's `or` and math's absolute value), alternatives come as a list.

Usage:
    prediction = extract_prediction(problem.family, model_text, problem.metadata)
    verdict = grade(problem.family, prediction, problem.answers, judge, problem.question,
                    tests=problem.metadata, limits=SandboxLimits(timeout_s=10))   # JudgeResult(correct, rationale)
"""
from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from pydantic import Field

from afm.config import Config
from agents.tools.sandbox import SandboxLimits, run_python
from problems.humaneval import completion_code, humaneval_check_program

QA_MATCH_FAMILIES = ("multihop", "hotpotqa", "mhqa", "wiki", "nq", "triviaqa", "2wiki", "musique")
CODE_FAMILIES = ("code", "computation", "math", "gsm8k", "aime")
TEST_FAMILIES = ("humaneval",)
TEST_FIELDS = ("prompt", "test", "entry_point")  # what running a HumanEval-style check program needs

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.S)
_CODE_CALL_RE = re.compile(r"<code>(.*?)</code>", re.S)
_BOXED_RE = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_LEADING_BLANK_LINES_RE = re.compile(r"\A(?:[ \t]*\n)+")


class ScoringConfig(Config):
    """Bounds on what the grader reads. Answer limits are per kind of family: a QA or numeric answer is a short
    span (a long one is rambling, or an attack on the judge), a program must hold a whole function."""

    max_scored_chars: int = Field(200_000, ge=1, description="Model text beyond this is not read for answers and "
                                                             "fails the RL format check (ast on megabytes would "
                                                             "stall the learner).")
    max_code_chars: int = Field(20_000, ge=1, description="A <code> block longer than this fails the RL format check.")
    qa_answer_chars: int = Field(2_000, ge=1, description="Longest answer graded for QA and judged families "
                                                          "(multihop, web, ...); longer is wrong, with a reason.")
    numeric_answer_chars: int = Field(2_000, ge=1, description="Longest answer graded for numeric families "
                                                               "(computation, math, gsm8k, ...).")
    program_answer_chars: int = Field(20_000, ge=1, description="Longest program graded for test-run families "
                                                                "(humaneval): the longest HumanEval reference "
                                                                "function is 1,993 chars before any fence or prose.")
    test_timeout_s: float = Field(10.0, gt=0.0, description="Wall-clock limit of one test run when the caller "
                                                            "passes no sandbox limits (verl's compute_score).")
    test_memory_mb: int = Field(1024, ge=64, description="Memory limit of one test run when the caller passes no "
                                                         "sandbox limits.")


DEFAULT_SCORING = ScoringConfig()


def reward_kind(family: str) -> str:
    """'tests' | 'code' | 'qa_match' | 'judge' for a problem family / verl data_source (prefix match)."""
    name = family.lower()
    if any(name.startswith(f) for f in TEST_FAMILIES):
        return "tests"
    if any(name.startswith(f) for f in QA_MATCH_FAMILIES):
        return "qa_match"
    if any(name.startswith(f) for f in CODE_FAMILIES):
        return "code"
    return "judge"


def answer_char_limit(family: str, cfg: ScoringConfig = DEFAULT_SCORING) -> int:
    kind = reward_kind(family)
    if kind == "tests":
        return cfg.program_answer_chars
    return cfg.numeric_answer_chars if kind == "code" else cfg.qa_answer_chars


def default_test_limits(cfg: ScoringConfig = DEFAULT_SCORING) -> SandboxLimits:
    """Sandbox limits of a test run when the caller has none of its own."""
    return SandboxLimits(timeout_s=cfg.test_timeout_s, cpu_s=int(cfg.test_timeout_s) + 1, memory_mb=cfg.test_memory_mb)


# ---------------------------------------------------------------- golden answers and matching (SQuAD)

def normalize_answer(text: str) -> str:
    """SQuAD normalization: lowercase, drop punctuation, drop articles a/an/the, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def split_answers(answers: str | list[str]) -> list[str]:
    """QA golden answers as a flat list: each string may hold alternatives separated by `|` (AFM convention)."""
    items = [answers] if isinstance(answers, str) else list(answers)
    return [part.strip() for item in items for part in str(item).split("|") if part.strip()]


def golden_answers(family: str, golden: str | list[str]) -> list[str]:
    """The golden alternatives of a problem: `|`-split for QA families, taken whole for code and math."""
    return _whole_answers(golden) if reward_kind(family) in ("code", "tests") else split_answers(golden)


def _whole_answers(golden: str | list[str]) -> list[str]:
    items = [golden] if isinstance(golden, str) else list(golden)
    return [str(item).strip() for item in items if str(item).strip()]


def exact_match(prediction: str, golden: str | list[str], family: str = "") -> float:
    """1.0 if the normalized prediction equals any normalized golden alternative, else 0.0. Alternatives are
    `golden_answers(family, golden)`: `|`-split unless `family` is a code/math family."""
    return _normalized_match(prediction, golden_answers(family, golden))


def _normalized_match(prediction: str, alternatives: list[str]) -> float:
    pred = normalize_answer(prediction)
    return float(bool(pred) and any(pred == normalize_answer(g) for g in alternatives))


def token_f1(prediction: str, golden: str | list[str], family: str = "") -> float:
    """Best SQuAD token-level F1 of the prediction against any golden alternative (as in `exact_match`)."""
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for gold in golden_answers(family, golden):
        gold_tokens = normalize_answer(gold).split()
        common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
        if common == 0:
            continue
        precision, recall = common / len(pred_tokens), common / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def numeric_match(prediction: str, golden: str | list[str], rel_tol: float = 1e-6) -> float:
    """1.0 if the prediction parses as a number equal (within rel_tol) to a golden number, else normalized match.
    Golden alternatives are taken whole (a list), never `|`-split."""
    def as_number(s: str) -> float | None:
        try:
            return float(s.strip().replace(",", "").rstrip("."))
        except ValueError:
            return None

    alternatives = _whole_answers(golden)
    pred = as_number(prediction)
    if pred is not None:
        for gold in alternatives:
            value = as_number(gold)
            if value is not None and abs(pred - value) <= rel_tol * max(1.0, abs(value)):
                return 1.0
    return _normalized_match(prediction, alternatives)


# ---------------------------------------------------------------- judges

@dataclass
class JudgeResult:
    correct: bool
    rationale: str  # why: the judge's reason, the test outcome, or what made the answer inadmissible


class Judge(Protocol):
    def judge(self, question: str, golden: list[str], prediction: str) -> JudgeResult: ...


class NormalizedMatchJudge:
    """Offline judge: correct iff the SQuAD-normalized prediction equals a golden alternative."""

    def judge(self, question: str, golden: list[str], prediction: str) -> JudgeResult:
        correct = bool(exact_match(prediction, golden))
        return JudgeResult(correct, "normalized exact match" if correct else "no normalized match")


# ---------------------------------------------------------------- reading the model's output

def extract_answer(model_text: str, family: str = "", cfg: ScoringConfig = DEFAULT_SCORING) -> str | None:
    """The text of the final `<answer>` the model wrote, or None if there is none or it is blank. A `\\boxed{}`
    inside wins; for test-run families the answer is code: no boxed, and only leading blank lines and trailing
    whitespace are dropped so that a function body keeps its first line's indentation."""
    matches = _ANSWER_RE.findall(model_text[:cfg.max_scored_chars])
    if not matches:
        return None
    if reward_kind(family) == "tests":
        answer = _LEADING_BLANK_LINES_RE.sub("", matches[-1]).rstrip()
    else:
        answer = matches[-1].strip()
        boxed = _BOXED_RE.findall(answer)
        if boxed:
            answer = boxed[-1].strip()
    return answer if answer.strip() else None


def extract_prediction(family: str, model_text: str, tests: Mapping[str, Any] | None = None,
                       cfg: ScoringConfig = DEFAULT_SCORING) -> str | None:
    """What gets graded: the final answer; for test-run families, the last `<code>` call when the answer is not
    code (a function run in `<code>`, then its result stated in words). `tests`: the problem's prompt, test and
    entry_point (a Problem's metadata), needed to tell a function body from prose."""
    answer = extract_answer(model_text, family, cfg)
    if reward_kind(family) != "tests" or not has_tests(tests):
        return answer
    if answer is not None:
        # an answer over its limit is graded as too long: compiling it to see whether it is code only costs time
        if len(answer) > answer_char_limit(family, cfg) or completion_code(tests, answer) is not None:
            return answer
    calls = _CODE_CALL_RE.findall(model_text[:cfg.max_scored_chars])
    return calls[-1] if calls else answer


def has_tests(tests: Mapping[str, Any] | None) -> bool:
    return bool(tests) and all(tests.get(key) for key in TEST_FIELDS)


# ---------------------------------------------------------------- grading

def inadmissible(family: str, prediction: str | None, cfg: ScoringConfig = DEFAULT_SCORING) -> str:
    """'' if the prediction may be graded; else why it is wrong without grading (no answer, too long)."""
    if prediction is None or not prediction.strip():
        return "no answer"
    limit = answer_char_limit(family, cfg)
    if len(prediction) > limit:
        return f"answer longer than {limit} chars (limit for family {family})"
    return ""


def grade(family: str, prediction: str | None, golden: str | list[str], judge: Judge, question: str = "",
          tests: Mapping[str, Any] | None = None, limits: SandboxLimits | None = None,
          cfg: ScoringConfig = DEFAULT_SCORING) -> JudgeResult:
    """Is `prediction` a correct answer? The one rule set (module docstring). `tests` is needed for test-run
    families; `limits` bound each test run (default: `default_test_limits(cfg)`)."""
    refusal = inadmissible(family, prediction, cfg)
    if refusal:
        return JudgeResult(False, refusal)
    kind = reward_kind(family)
    if kind == "tests":
        return run_tests(family, prediction, tests, limits or default_test_limits(cfg))
    alternatives = golden_answers(family, golden)
    if kind == "code":
        correct = bool(numeric_match(prediction, alternatives))
        return JudgeResult(correct, "numeric/normalized match" if correct else "no numeric/normalized match")
    return judge.judge(question, alternatives, prediction)


def run_tests(family: str, code: str, tests: Mapping[str, Any] | None, limits: SandboxLimits) -> JudgeResult:
    """Run `code` (a whole function or its body) against the problem's tests in the sandbox."""
    if not has_tests(tests):
        return JudgeResult(False, f"no tests to run for family {family} (needs {', '.join(TEST_FIELDS)})")
    if completion_code(tests, code) is None:
        return JudgeResult(False, "answer is not code (neither the function nor its body)")
    result = run_python(humaneval_check_program(tests, code), limits)
    if result.status == "ok":
        return JudgeResult(True, "all tests passed")
    return JudgeResult(False, f"tests failed ({result.status}): {result.stderr.strip()[-300:]}")

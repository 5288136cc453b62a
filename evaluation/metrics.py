"""Evaluation metrics, pure functions: unbiased pass@k, accuracy, per-problem aggregation, failure categories,
best-of-n selection (by judge, by majority vote) and test-time-scaling (TTS) curves.

Every function works on plain values or on `EvalRecord`s (one sampled episode of one model on one problem,
see `evaluation.records`). Nothing here runs a model.

Usage:
    pass_at_k(n=5, c=2, k=3)                      # 0.9
    curve = pass_at_k_curve(records, ks=[1, 2, 3])  # {1: ..., 2: ..., 3: ...} averaged over problems
    majority_vote(["Paris", "paris.", "Lyon"])      # "Paris" (normalized answers vote, first spelling wins)
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from evaluation.records import EvalRecord

# Why an episode did not solve its problem. "correct" is listed so every record has exactly one category.
# Statuses match training.rl_rollout.STATUSES (+ tool_error, no_answer for teacher runs and failed tools).
FAILURE_CATEGORIES = ("correct", "wrong_answer", "format_error", "max_turns", "token_budget", "tool_error", "no_answer")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): probability that at least one of k samples drawn without replacement
    from n samples, c of them correct, is correct: 1 - C(n-c, k) / C(n, k).

    Computed as the product 1 - prod_{i=n-c+1}^{n} (1 - k / i), which never forms the huge binomials."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}; sample at least k episodes per problem")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


@dataclass
class ProblemOutcome:
    """All samples of one model on one problem of one set."""

    model: str
    problem_set: str
    problem_id: str
    records: list[EvalRecord]

    @property
    def n(self) -> int:
        return len(self.records)

    @property
    def c(self) -> int:
        return sum(1 for r in self.records if r.correct)


def group_by_problem(records: Iterable[EvalRecord]) -> list[ProblemOutcome]:
    """Group records by (model, problem set, problem id), samples sorted by their sample index."""
    groups: dict[tuple[str, str, str], list[EvalRecord]] = defaultdict(list)
    for rec in records:
        groups[(rec.model, rec.problem_set, rec.problem_id)].append(rec)
    return [
        ProblemOutcome(model, pset, pid, sorted(recs, key=lambda r: r.sample))
        for (model, pset, pid), recs in groups.items()
    ]


def mean(values: Sequence[float]) -> float:
    """Mean of `values`; 0.0 for an empty sequence (an empty set scores nothing, it does not crash a report)."""
    return sum(values) / len(values) if values else 0.0


def accuracy(records: Sequence[EvalRecord]) -> float:
    """Judge accuracy over all samples (equals unbiased pass@1 averaged over problems when every problem has
    the same number of samples)."""
    return mean([1.0 if r.correct else 0.0 for r in records])


def exact_match_rate(records: Sequence[EvalRecord]) -> float:
    return mean([r.em for r in records])


def mean_f1(records: Sequence[EvalRecord]) -> float:
    return mean([r.f1 for r in records])


def pass_at_k_over_problems(outcomes: Sequence[ProblemOutcome], k: int) -> float:
    """Unbiased pass@k averaged over problems. Raises if a problem has fewer than k samples."""
    return mean([pass_at_k(o.n, o.c, k) for o in outcomes])


def pass_at_k_curve(records: Iterable[EvalRecord], ks: Iterable[int]) -> dict[int, float]:
    """Test-time-scaling curve: pass@k for each k (records of ONE model on one or more sets)."""
    outcomes = group_by_problem(records)
    return {k: pass_at_k_over_problems(outcomes, k) for k in ks}


def failure_category(status: str, correct: bool) -> str:
    """One category per episode. `status` is how the episode ended: "answered" (it wrote an <answer>),
    "format_error" (unparseable output or a broken tag), "max_turns" (turn budget spent), "token_budget"
    (token budget spent), "tool_error" (a tool failed and the episode could not go on), "no_answer" (stopped without
    an answer). An answered episode that the judge rejects is a "wrong_answer"."""
    if correct:
        return "correct"
    if status == "answered":
        return "wrong_answer"
    if status not in FAILURE_CATEGORIES:
        raise ValueError(f"failure_category: unknown episode status {status!r}; expected 'answered' or one of "
                         f"{', '.join(FAILURE_CATEGORIES[2:])}")
    return status


def failure_breakdown(records: Sequence[EvalRecord]) -> dict[str, float]:
    """Share of records per failure category (all categories present, summing to 1 for non-empty input)."""
    counts = Counter(r.failure for r in records)
    total = len(records)
    return {cat: (counts[cat] / total if total else 0.0) for cat in FAILURE_CATEGORIES}


def majority_vote(answers: Sequence[str], normalize: Callable[[str], str]) -> str | None:
    """The answer whose normalized form is most frequent; ties go to the normalized form seen first; the
    returned spelling is the first one seen with that form. Empty answers do not vote; None if none remain."""
    first_spelling: dict[str, str] = {}
    votes: Counter[str] = Counter()
    for ans in answers:
        key = normalize(ans)
        if not key:
            continue
        first_spelling.setdefault(key, ans)
        votes[key] += 1
    if not votes:
        return None
    best = max(votes.values())
    winner = next(key for key in first_spelling if votes[key] == best)
    return first_spelling[winner]


def best_of_n_by_judge(records: Sequence[EvalRecord]) -> EvalRecord:
    """Oracle best-of-n: the first sample the judge accepts, else the first sample. Its accuracy over problems
    equals pass@n; it is the upper bound a verifier-based selector could reach."""
    if not records:
        raise ValueError("best_of_n_by_judge: no samples")
    return next((r for r in records if r.correct), records[0])


def best_of_n_by_majority(records: Sequence[EvalRecord], normalize: Callable[[str], str]) -> EvalRecord:
    """Majority-vote selection: the first sample whose (normalized) prediction is the majority answer;
    the first sample if no sample produced an answer."""
    if not records:
        raise ValueError("best_of_n_by_majority: no samples")
    winner = majority_vote([r.prediction for r in records], normalize)
    if winner is None:
        return records[0]
    key = normalize(winner)
    return next(r for r in records if normalize(r.prediction) == key)


def majority_at_k_curve(records: Iterable[EvalRecord], ks: Iterable[int],
                        normalize: Callable[[str], str]) -> dict[int, float]:
    """Test-time-scaling by self-consistency: accuracy of majority voting over the first k samples, per k.
    Raises if a problem has fewer than k samples."""
    outcomes = group_by_problem(records)
    curve: dict[int, float] = {}
    for k in ks:
        hits = []
        for o in outcomes:
            if o.n < k:
                raise ValueError(f"majority@{k}: problem {o.problem_id!r} of {o.model!r} has only {o.n} samples")
            hits.append(1.0 if best_of_n_by_majority(o.records[:k], normalize).correct else 0.0)
        curve[k] = mean(hits)
    return curve

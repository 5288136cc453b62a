"""Progressive quality filtering of converted trajectories (the paper's recipe), each stage a pure function.

Stages, in order (`run_filters`):
1. complexity  - drop trajectories with fewer than `min_interactions` or more than `max_interactions`
                 model-written segments (paper: 5-20).
2. quality     - keep answers that are verified: the MAS verified it, it matches the problem's answers
                 (normalized / numeric match, `|`-separated parts), and for code families the answer is printed by
                 a successful code run in the trajectory (an execution check on the recorded observation).
3. reflection  - prefer reflective trajectories: keep every one with a reflection or a self-correction, and a
                 deterministic `plain_keep_fraction` of the rest (chosen by a hash of the id, so it is stable).
4. upsampling  - repeat error-then-corrected trajectories `error_correction_repeat` times in total (copies get
                 ids `<id>#up<k>`).
Each stage: `(items, cfg, ...) -> FilterResult(kept, dropped_reasons, name)`; report rows are
`{stage, in, out, reasons, with_parse_failures}`, the last counting the items entering the stage whose teacher
log had a role reply that never parsed (so the report shows where those trajectories went).

Usage:
    kept, report = run_filters(trajectories, problems, FilterConfig())
"""
from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass, replace

from pydantic import Field

from afm.config import Config
from agents.teacher.answers import answer_matches
from models.format import Trajectory
from problems.records import Problem

CODE_FAMILIES = ("computation",)
SUCCESS_STATUS = "[RESULT:SUCCESS]"


class FilterConfig(Config):
    """Thresholds of the progressive filter."""

    min_interactions: int = Field(5, ge=0, description="Complexity: drop trajectories with fewer model segments")
    max_interactions: int = Field(20, ge=1, description="Complexity: drop longer ones (the paper's set: 5-20 steps)")
    require_mas_verified: bool = Field(True, description="Quality: also require the MAS's own verification")
    plain_keep_fraction: float = Field(0.7, ge=0.0, le=1.0,
                                       description="Reflection: share of non-reflective trajectories kept")
    error_correction_repeat: int = Field(2, ge=1, description="Upsampling: total copies of erred-then-corrected ones")


@dataclass
class FilterResult:
    kept: list[Trajectory]
    dropped_reasons: Counter
    name: str


def filter_complexity(items: list[Trajectory], cfg: FilterConfig) -> FilterResult:
    kept, dropped = [], Counter()
    for t in items:
        if t.interactions < cfg.min_interactions:
            dropped[f"fewer_than_{cfg.min_interactions}_interactions"] += 1
        elif t.interactions > cfg.max_interactions:
            dropped[f"more_than_{cfg.max_interactions}_interactions"] += 1
        else:
            kept.append(t)
    return FilterResult(kept, dropped, "complexity")


def _printed_by_code(t: Trajectory) -> bool:
    """The answer appears as an output line of a successful code observation."""
    for seg in t.segments:
        if seg.tag == "observation" and seg.text.startswith(SUCCESS_STATUS):
            if t.answer.strip() in (line.strip() for line in seg.text.splitlines()[1:]):
                return True
    return False


def filter_quality(items: list[Trajectory], cfg: FilterConfig, problems: dict[str, Problem]) -> FilterResult:
    kept, dropped = [], Counter()
    for t in items:
        problem = problems.get(t.metadata.get("problem_id", ""))
        if problem is None:
            dropped["unknown_problem"] += 1
        elif cfg.require_mas_verified and not t.metadata.get("verified"):
            dropped["not_verified_by_mas"] += 1
        elif problem.answers and not answer_matches(t.answer, problem.answers):
            dropped["wrong_answer"] += 1
        elif t.family in CODE_FAMILIES and not _printed_by_code(t):
            dropped["answer_not_printed_by_code"] += 1
        else:
            kept.append(t)
    return FilterResult(kept, dropped, "quality")


def _stable_fraction(key: str) -> float:
    return zlib.crc32(key.encode("utf-8")) / 0xFFFFFFFF


def filter_reflection(items: list[Trajectory], cfg: FilterConfig) -> FilterResult:
    kept, dropped = [], Counter()
    for t in items:
        if t.metadata.get("reflective") or t.metadata.get("erred_and_corrected"):
            kept.append(t)
        elif _stable_fraction(t.id) < cfg.plain_keep_fraction:
            kept.append(t)
        else:
            dropped["no_reflection_not_sampled"] += 1
    return FilterResult(kept, dropped, "reflection")


def upsample_error_correction(items: list[Trajectory], cfg: FilterConfig) -> FilterResult:
    out = []
    for t in items:
        out.append(t)
        if t.metadata.get("erred_and_corrected"):
            for k in range(1, cfg.error_correction_repeat):
                out.append(replace(t, id=f"{t.id}#up{k}", metadata={**t.metadata, "upsampled_copy": k}))
    return FilterResult(out, Counter(), "upsampling")


def run_filters(trajectories: list[Trajectory], problems: list[Problem],
                cfg: FilterConfig) -> tuple[list[Trajectory], list[dict]]:
    by_id = {p.id: p for p in problems}
    stages = [
        lambda items: filter_complexity(items, cfg),
        lambda items: filter_quality(items, cfg, by_id),
        lambda items: filter_reflection(items, cfg),
        lambda items: upsample_error_correction(items, cfg),
    ]
    items, report = list(trajectories), []
    for stage in stages:
        result = stage(items)
        report.append({"stage": result.name, "in": len(items), "out": len(result.kept),
                       "reasons": dict(result.dropped_reasons),
                       "with_parse_failures": sum(1 for t in items if t.metadata.get("parse_failures"))})
        items = result.kept
    return items, report

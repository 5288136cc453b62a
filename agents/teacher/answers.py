"""Answer normalization and matching shared by the oracle's verification and the quality filter.

QA convention (AFM release): lower-case, drop punctuation and articles, collapse whitespace; several answers in
one string are separated by `|`; numbers compare numerically ("42" == "42.0").

    answer_matches("The Kell Brin.", ["Kell Brin"])  # True
"""
from __future__ import annotations

import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    text = _ARTICLES.sub(" ", text.lower().translate(_PUNCT))
    return " ".join(text.split())


def _as_number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").strip())
    except ValueError:
        return None


def answer_matches(prediction: str, references: list[str]) -> bool:
    """True if any `|`-separated part of `prediction` matches any reference (normalized or numerically)."""
    refs = {normalize_answer(r) for r in references}
    ref_numbers = {n for n in (_as_number(r) for r in references) if n is not None}
    for part in prediction.split("|"):
        number = _as_number(part)
        if number is not None and ref_numbers:
            # numbers compare as numbers only: stripping the "." would make "4.2" equal "42"
            if number in ref_numbers:
                return True
        elif normalize_answer(part) and normalize_answer(part) in refs:
            return True
    return False

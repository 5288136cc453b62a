"""The role reply protocol: what each role agent must answer, as a JSON schema a server can enforce, and a
tolerant parser for servers that do not enforce it.

Two ways a reply arrives:
- structured output (a per-backend flag, `OpenAIClientConfig.structured_output`): the server constrains decoding
  to `ROLE_SCHEMAS[role]` (OpenAI `response_format` json_schema, vLLM guided decoding), so the reply is a JSON
  object;
- plain text: the reply follows the prompt's line protocol more or less. Real models add markdown
  (`**NEXT:** search`), change case (`Next:`), add punctuation (`NEXT: search.`), wrap the reply in prose or a
  code fence, or answer in JSON unprompted. The parsers accept all of these; `tests/teacher/test_protocol.py`
  holds the table of shapes.

Every parser returns `None` for "nothing found" (never a silent default): the MAS re-asks within the role's
retry budget and counts what is still unparseable in the log (`MASLog.parse_failures`).

What this does NOT cover: replies in another language, a score on a scale it cannot see (`Score: 7` without
`/10` is a failure, not a guess), or a NEXT that names two agents (the last one named wins).

Usage:
    decision = parse_think(text)            # .next_agent None when no known agent is named
    score = parse_check_score(text)         # 1..4 or None
    aspects = parse_reflection(text)        # {aspect: good|average|poor} for the aspects found (may be empty)
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

THINKING_NEXT = ("planning", "search", "crawl", "code", "reflection", "answer")
REFLECTION_ASPECTS = ("information conflict", "tool effectiveness", "trajectory monitoring")
REFLECTION_LEVELS = ("good", "average", "poor")
SCORE_RANGE = (1, 4)

# Server-enforced shapes. All properties required and no extras: OpenAI's strict json_schema mode demands it.
ROLE_SCHEMAS: dict[str, dict[str, Any]] = {
    "thinking": {
        "type": "object", "additionalProperties": False, "required": ["thought", "next", "answer"],
        "properties": {"thought": {"type": "string"}, "next": {"type": "string", "enum": list(THINKING_NEXT)},
                       "answer": {"type": "string"}},
    },
    "verification": {
        "type": "object", "additionalProperties": False, "required": ["score", "comment"],
        "properties": {"score": {"type": "integer", "enum": [1, 2, 3, 4]}, "comment": {"type": "string"}},
    },
    "reflection": {
        "type": "object", "additionalProperties": False,
        "required": [a.replace(" ", "_") for a in REFLECTION_ASPECTS] + ["comment"],
        "properties": {**{a.replace(" ", "_"): {"type": "string", "enum": list(REFLECTION_LEVELS)}
                          for a in REFLECTION_ASPECTS}, "comment": {"type": "string"}},
    },
}


def with_string_caps(schema: dict[str, Any], max_chars: int) -> dict[str, Any]:
    """`schema` with `maxLength` on its free-text fields. Guided decoding writes a string until the model closes
    it; an untrained or rambling model would run into max_tokens and leave invalid JSON. (OpenAI's strict mode
    does not take maxLength, so only the vLLM modes send it.)"""
    props = {k: ({**v, "maxLength": max_chars} if v.get("type") == "string" and "enum" not in v else v)
             for k, v in schema["properties"].items()}
    return {**schema, "properties": props}


# What the system prompt says when the server enforces the schema (the model should know the fields' meaning).
JSON_INSTRUCTIONS = {
    "thinking": 'Reply as JSON: {"thought": ..., "next": <agent>, "answer": <answer or "">}.',
    "verification": 'Reply as JSON: {"score": 1-4, "comment": ...}.',
    "reflection": 'Reply as JSON: {"information_conflict": good|average|poor, "tool_effectiveness": ..., '
                  '"trajectory_monitoring": ..., "comment": ...}.',
}
# What the agent is told after an unparseable reply (the retry), per role.
RETRY_HINTS = {
    "thinking": "Your reply named no next agent. Reply again: one short thought, then a line 'NEXT: <agent>' with "
                "agent one of " + ", ".join(THINKING_NEXT) + ".",
    "verification": "Your reply had no score. Reply again, starting with 'score: N.' (N from 1 to 4).",
    "reflection": "Your reply scored no aspect. Reply again as 'information conflict: good|average|poor; tool "
                  "effectiveness: ...; trajectory monitoring: ...;' then one sentence.",
}

# Markdown and quoting a model wraps a keyword or value in: **x**, __x__, `x`, "x", 'x', [x], <x>.
_DECOR = "*_`\"'[]<>#"
_FENCE_RE = re.compile(r"```[\w-]*[ \t]*\n?(.*?)```", re.S)
_NEXT_RE = re.compile(r"(?:^|[^\w*_`])[*_`]*next(?:[ _]agent|[ _]step|[ _]action)?[*_`\s]*(?::|=|->|—|-)"
                      r"\s*[*_`\"'\[<\s]*"
                      r"([A-Za-z_][A-Za-z_ ]{0,30}?)[*_`\"'\]>\s]*(?:[.!,;)]|$|\n)", re.I | re.M)
_ANSWER_RE = re.compile(r"^[\s>*_#-]*(?:final[ _])?answer[*_`\s]*(?::|=|—|-)[*_`\s]*(.+?)\s*$", re.I | re.M)
_BOXED_RE = re.compile(r"\\boxed\{([^{}]+)\}")
_THOUGHT_PREFIX_RE = re.compile(r"^[\s*_#>-]*thought[*_`\s]*:[*_`\s]*", re.I)
_SCORE_RE = re.compile(r"(?:score|rating)[*_`\s]*(?:of|is|:|=|-|—)?[*_`\s]*(?:is[*_`\s]*)?\[?"
                       r"(\d+(?:\.\d+)?|one|two|three|four)\]?(?:\s*(?:/|out of)\s*(\d+))?", re.I)
_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4}
_LEVEL_SYNONYMS = {"good": "good", "excellent": "good", "high": "good", "average": "average", "fair": "average",
                   "medium": "average", "moderate": "average", "ok": "average", "okay": "average", "poor": "poor",
                   "bad": "poor", "low": "poor"}
_ASPECT_RE = {a: re.compile(r"\b" + r"[\s_-]+".join(a.split()) + r"[*_`\s]*(?::|=|-|—|is)?[*_`\s]*"
                            r"(" + "|".join(_LEVEL_SYNONYMS) + r")\b", re.I) for a in REFLECTION_ASPECTS}
_AGENT_SYNONYMS = {"plan": "planning", "planner": "planning", "web search": "search", "web_search": "search",
                   "websearch": "search", "crawl_page": "crawl", "crawl page": "crawl", "crawler": "crawl",
                   "read": "crawl", "python": "code", "coding": "code", "reflect": "reflection",
                   "final answer": "answer", "final_answer": "answer", "suggested answer": "answer"}


def one_line(text: str) -> str:
    return " ".join(text.split())


def _strip_decor(text: str) -> str:
    return text.strip().strip(_DECOR).strip()


def json_reply(text: str) -> dict[str, Any] | None:
    """The JSON object in a reply: the whole reply, a fenced block, or the outermost {...} inside prose."""
    candidates = [text.strip()] + [m.group(1).strip() for m in _FENCE_RE.finditer(text)]
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start:end + 1])
    for candidate in candidates:
        if candidate.startswith("{"):
            try:  # strict=False: a sampled string may hold raw control characters, which json rejects
                value = json.loads(candidate, strict=False)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return {str(k).lower().replace(" ", "_"): v for k, v in value.items()}
    return None


def agent_name(raw: str) -> str | None:
    """A known agent from how a model wrote it: `Search`, `web_search`, `search agent`, `the planner`."""
    name = _strip_decor(raw).lower().replace("-", " ")
    name = re.sub(r"^(?:the|call|use|ask)\s+", "", name)
    name = re.sub(r"\s+(?:agent|tool|step)$", "", name).strip()
    name = _AGENT_SYNONYMS.get(name, name)
    return name if name in THINKING_NEXT else None


@dataclass
class ThinkDecision:
    thought: str
    next_agent: str | None  # None when the reply names no known agent (the coordinator is asked again)
    answer: str | None


def _clean_answer(raw: str) -> str:
    answer = _strip_decor(raw)
    boxed = _BOXED_RE.search(answer)
    return boxed.group(1).strip() if boxed else answer


def parse_think(text: str) -> ThinkDecision:
    data = json_reply(text)
    if data is not None and any(k in data for k in ("next", "next_agent", "agent", "action")):
        raw = next(str(data[k]) for k in ("next", "next_agent", "agent", "action") if k in data)
        answer = str(data.get("answer") or data.get("final_answer") or "").strip()
        return ThinkDecision(one_line(str(data.get("thought", ""))), agent_name(raw),
                             _clean_answer(answer) if answer else None)
    body = "\n".join(m.group(1) for m in _FENCE_RE.finditer(text)) if text.lstrip().startswith("```") else text
    matches = list(_NEXT_RE.finditer(body))
    # the decision usually closes the reply; a model that names two agents meant the last one
    nxt = next((name for m in reversed(matches) if (name := agent_name(m.group(1)))), None)
    ans = list(_ANSWER_RE.finditer(body))
    answer = _clean_answer(ans[-1].group(1)) if ans else None
    if answer is None and (boxed := _BOXED_RE.search(body)):
        answer = boxed.group(1).strip()
    thought = body
    for m in reversed(matches + ans):  # drop the protocol lines, keep the reasoning
        thought = thought[:m.start()] + "\n" + thought[m.end():]
    thought = _THOUGHT_PREFIX_RE.sub("", thought.strip())
    return ThinkDecision(thought=one_line(thought), next_agent=nxt, answer=answer or None)


def _rescale(value: float, out_of: int | None) -> int | None:
    lo, hi = SCORE_RANGE
    if out_of and out_of != hi:
        if value > out_of or out_of <= 1:
            return None
        value = lo + (value - 1) * (hi - lo) / (out_of - 1)  # 4/5 -> 3.25 -> 3; 10/10 -> 4
    score = int(value + 0.5)
    return score if lo <= score <= hi else None


def parse_check_score(text: str) -> int | None:
    """The double_check score 1-4 (`score: 4`, `**Score:** 4`, `Score: 4/5` rescaled, `{"score": 4}`), or None."""
    data = json_reply(text)
    if data is not None and "score" in data:
        raw = str(data["score"]).strip().lower()
        m = re.match(r"(\d+(?:\.\d+)?|one|two|three|four)(?:\s*/\s*(\d+))?$", raw)
        if m:
            value = _WORDS.get(m.group(1)) or float(m.group(1))
            return _rescale(value, int(m.group(2)) if m.group(2) else None)
    for m in _SCORE_RE.finditer(text):
        value = _WORDS.get(m.group(1).lower()) or float(m.group(1))
        score = _rescale(value, int(m.group(2)) if m.group(2) else None)
        if score is not None:
            return score
    return None


def check_passes(text: str) -> bool:
    """A double_check that verifies: score >= 3. No score is not a verification."""
    score = parse_check_score(text)
    return score is not None and score >= 3


def parse_reflection(text: str) -> dict[str, str]:
    """{aspect: good|average|poor} for each aspect the reply scores; aspects it does not score are absent."""
    data = json_reply(text)
    out: dict[str, str] = {}
    for aspect, pattern in _ASPECT_RE.items():
        raw = data.get(aspect.replace(" ", "_")) if data is not None else None
        if raw is None:
            m = pattern.search(text)
            raw = m.group(1) if m else None
        level = _LEVEL_SYNONYMS.get(_strip_decor(str(raw)).lower()) if raw is not None else None
        if level:
            out[aspect] = level
    return out


def reflection_wants_replan(text: str) -> bool:
    return "poor" in parse_reflection(text).values()


def reply_parses(role: str, text: str) -> bool:
    """Whether a role's reply carries what the MAS needs from it (roles without a protocol always parse)."""
    if role == "thinking":
        return parse_think(text).next_agent is not None
    if role == "verification":
        return parse_check_score(text) is not None
    if role == "reflection":
        return bool(parse_reflection(text))
    return True


def canonical_reply(role: str, text: str) -> str:
    """A JSON reply of a scored role rewritten as the line protocol, so MAS logs (and the CoA segments made from
    them) read the same whichever way the server answered; other replies come back stripped."""
    data = json_reply(text)
    if data is None or role not in ("verification", "reflection") or not reply_parses(role, text):
        return text.strip()
    comment = one_line(str(data.get("comment", "")))
    if role == "verification":
        return f"score: {parse_check_score(text)}. {comment}".strip()
    aspects = parse_reflection(text)
    scored = " ".join(f"{a}: {aspects.get(a, 'average')};" for a in REFLECTION_ASPECTS)
    return f"{scored} {comment}" if comment else scored

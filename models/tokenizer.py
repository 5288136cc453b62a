"""Tokenization of CoA prompts and trajectories: a locally trained tokenizer, loss masks, the token round trip.

The default tokenizer is a byte-level BPE trained here (no hub download) in which every CoA tag
(`<think>`, `</think>`, ..., `<observation>`, `</observation>`) is ONE special token, with Qwen's chat tokens
`<|im_start|>`, `<|im_end|>` (eos) and `<|endoftext|>` (pad) and a Qwen-style chat template. Every other
function here also works with a real checkpoint's tokenizer (e.g. Qwen's); SFT first makes the tags special
tokens of it (models/policy_tokens.py), keeping the checkpoint's own chat template. A template that injects a
default system turn when none is given (Qwen2.5's "You are Qwen, ...") gets none: the system prompt is only
ever the configured one.

Text that comes from outside the model (tool observations, user questions) is UNTRUSTED: it is tokenized
with special-token parsing switched off (`encode_untrusted`), so a page containing `</observation><answer>`
literally becomes ordinary byte tokens and can never forge a tag, an end-of-turn or a role switch.

Usage:
    tok = train_tokenizer(texts, vocab_size=2048); tok.save_pretrained(d)
    prompt_ids = encode_prompt(tok, question, system_prompt)
    ex = encode_trajectory(tok, traj, system_prompt)    # ex.input_ids, ex.loss_mask (observations = 0)
    obs_ids = encode_observation(tok, tool_output)      # what RL appends after a tool call
    check_token_roundtrip(tok, prompt_ids, response_ids, traj, system_prompt)   # raises on drift
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from models.format import OBSERVATION_CLOSE, OBSERVATION_OPEN, TAGS, Segment, Trajectory, render_segment

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TAG_TOKENS = tuple(tok for tag in TAGS for tok in (f"<{tag}>", f"</{tag}>"))

# Qwen's ChatML layout without Qwen's default system prompt (our tiny model has no identity to announce).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Pre-tokenizer of the tiny tokenizer: Qwen2's regex, except that a capitalized word is split into pieces of one
# capital + at most one letter, then two letters at a time, with no leading space or quote attached:
#   ' Vazoma is' -> ' ' 'Va' 'zo' 'ma' ' is';  '<web_search>Vazoma' -> 'Va' 'zo' 'ma';  '"Vazoma"' -> '"' 'Va' 'zo' 'ma' '"'
# Why: a name must be the SAME tokens wherever it appears (question, observation, query, answer) and be made of
# tokens every training name also uses, so that answering about an unseen name is copying token ids. With
# Qwen's regex a name was one merged token after a space (' Vazoma') and 'V' 'azoma' inside a tag, and held-out
# names split into pieces no training target had; a 1M-parameter student then cannot copy (docs/quality.md).
# BPE never merges across these pieces. Lowercase words, digits and punctuation are split as Qwen2 splits them.
NAME_PIECES_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    r"|\p{Lu}\p{Ll}?"                             # first piece of a capitalized word
    r"|(?<=\p{L})\p{Ll}{1,2}"                     # its next pieces (only reachable inside such a word)
    r"|[^\r\n\p{L}\p{N}]?\p{Ll}+"                 # a lowercase word with one leading space/punctuation
    r"|[^\r\n\p{L}\p{N}]?[\p{Lt}\p{Lm}\p{Lo}]+"   # caseless scripts (CJK, ...) as in Qwen2
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Stands in for the question while the chat template is rendered, so the question can be tokenized as
# untrusted text between the template's own (trusted) pieces.
_QUESTION_SLOT = "\x00AFM_QUESTION_SLOT\x00"


class TokenRoundTripError(AssertionError):
    """Re-rendering and re-tokenizing a rollout did not reproduce the token ids that were generated."""


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts`; CoA tags and chat tokens are special tokens (one id each)."""
    specials = [ENDOFTEXT, IM_START, IM_END, *TAG_TOKENS]
    backend = Tokenizer(models.BPE())
    # Qwen2's pipeline with NAME_PIECES_REGEX; reload with `load_tokenizer` (AutoTokenizer would put Qwen2's own
    # regex back). NFC means non-NFC input text does not decode back byte for byte (as in Qwen).
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(NAME_PIECES_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, show_progress=False,
        # The full byte alphabet makes any text encodable, whatever the training corpus contained.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=IM_END, pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START, *TAG_TOKENS],
        # Decoding must give back the exact text so rendered trajectories round-trip byte for byte.
        clean_up_tokenization_spaces=False,
        # Left padding: generation batches prompts of different lengths.
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved in `path`, exactly as its tokenizer.json defines it.

    Not AutoTokenizer for such directories: transformers 5 rebuilds a qwen2-type checkpoint's tokenizer as
    Qwen2Tokenizer with a hard-coded pre-tokenizer, ignoring the one in tokenizer.json (ours splits names,
    see NAME_PIECES_REGEX). A real Qwen checkpoint's tokenizer.json holds Qwen's own pipeline, so it loads the same.
    Directories without a tokenizer.json (slow-only tokenizers) go through AutoTokenizer.
    """
    path = Path(path)
    if (path / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def encode_untrusted(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids for text from outside the model; special-token strings in it are split into ordinary tokens.

    Does NOT cover: what the text says (prompt injection in plain words is the policy's problem).
    """
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def _encode_trusted(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids for text we wrote ourselves (tags, template pieces): special-token strings become specials."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=False)["input_ids"]


def decode(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> str:
    """Exact text of `ids`, tags and special tokens included."""
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, question: str, system_prompt: str | None = None) -> list[int]:
    """Chat-templated prompt ending with the assistant header; the question is tokenized as untrusted text."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
    messages.append({"role": "user", "content": _QUESTION_SLOT})
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if system_prompt is None:
        rendered = _without_injected_system_turn(rendered)
    pieces = rendered.split(_QUESTION_SLOT)
    if len(pieces) != 2:
        raise ValueError(
            f"the tokenizer's chat template must insert the user message verbatim exactly once "
            f"(found it {len(pieces) - 1} times); fix chat_template in tokenizer_config.json"
        )
    return _encode_trusted(tokenizer, pieces[0]) + encode_untrusted(tokenizer, question) + _encode_trusted(
        tokenizer, pieces[1]
    )


def _without_injected_system_turn(rendered: str) -> str:
    """`rendered` minus a leading ChatML system turn that the template added on its own (Qwen2.5 adds one when
    the messages have none); the question slot never sits inside it."""
    header = IM_START + "system\n"
    if not rendered.startswith(header):
        return rendered
    end = rendered.index(IM_END, len(header)) + len(IM_END)
    return rendered[end + 1:] if rendered[end:end + 1] == "\n" else rendered[end:]


def encode_observation(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """The ids RL inserts after a tool call: OBSERVATION_OPEN + untrusted tool output + OBSERVATION_CLOSE."""
    return (
        _encode_trusted(tokenizer, OBSERVATION_OPEN)
        + encode_untrusted(tokenizer, text)
        + _encode_trusted(tokenizer, OBSERVATION_CLOSE)
    )


def encode_segment(tokenizer: PreTrainedTokenizerBase, seg: Segment) -> list[int]:
    """One rendered segment's ids. A model segment is tokenized whole (`<tag>text</tag>`), so a tokenizer
    whose tags are plain text (Qwen) gets the same ids as when it generated them; observations are untrusted."""
    if seg.tag == "observation":
        return encode_observation(tokenizer, seg.text)
    specials = set(tokenizer.all_special_tokens) | set(tokenizer.get_added_vocab())
    leaked = next((s for s in specials if s in seg.text), None)
    if leaked is not None:
        raise ValueError(f"<{seg.tag}> segment text contains the special token {leaked!r}; drop this trajectory")
    return _encode_trusted(tokenizer, render_segment(seg))


@dataclass
class EncodedExample:
    """One training sequence: ids and a per-token loss mask (1 = the model wrote it, learn it)."""

    input_ids: list[int]
    loss_mask: list[int]


def encode_segments(tokenizer: PreTrainedTokenizerBase, segments: Sequence[Segment]) -> EncodedExample:
    """The assistant part of a trajectory (no prompt, no eos): model segments mask 1, observations mask 0."""
    ids: list[int] = []
    mask: list[int] = []
    for seg in segments:
        seg_ids = encode_segment(tokenizer, seg)
        ids += seg_ids
        mask += [0 if seg.tag == "observation" else 1] * len(seg_ids)
    return EncodedExample(ids, mask)


def encode_trajectory(
    tokenizer: PreTrainedTokenizerBase, traj: Trajectory, system_prompt: str | None = None
) -> EncodedExample:
    """Prompt (mask 0) + segments tokenized piecewise (observations mask 0, model segments 1) + eos (mask 1)."""
    prompt = encode_prompt(tokenizer, traj.question, system_prompt)
    body = encode_segments(tokenizer, traj.segments)
    return EncodedExample(
        input_ids=prompt + body.input_ids + [tokenizer.eos_token_id],
        loss_mask=[0] * len(prompt) + body.loss_mask + [1],
    )


def _first_difference(expected: Sequence[int], actual: Sequence[int]) -> int | None:
    for i, (e, a) in enumerate(zip(expected, actual)):
        if e != a:
            return i
    return None if len(expected) == len(actual) else min(len(expected), len(actual))


def _raise_drift(tokenizer: PreTrainedTokenizerBase, what: str, expected: Sequence[int], actual: Sequence[int]) -> None:
    pos = _first_difference(expected, actual)
    if pos is None:
        return
    lo = max(0, pos - 8)
    raise TokenRoundTripError(
        f"{what}: token {pos} differs (expected {len(expected)} ids, got {len(actual)}); "
        f"expected {list(expected[pos:pos + 4])} {decode(tokenizer, expected[pos:pos + 8])!r}, "
        f"got {list(actual[pos:pos + 4])} {decode(tokenizer, actual[pos:pos + 8])!r}; "
        f"context before: {decode(tokenizer, actual[lo:pos])!r}"
    )


def check_token_roundtrip(
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: Sequence[int],
    response_ids: Sequence[int],
    traj_or_segments: Trajectory | Sequence[Segment],
    system_prompt: str | None = None,
) -> None:
    """Raise TokenRoundTripError unless rendering + tokenizing reproduces exactly the ids of a rollout.

    `response_ids` are the generated and inserted ids after the prompt; a single trailing eos is accepted.
    With a Trajectory the prompt is checked too (against `encode_prompt(question, system_prompt)`); with
    bare segments only the response is. Drift means the learner would score ids the sampler never produced
    (e.g. the model spelled `<think>` with byte tokens, or whitespace between segments was lost).
    """
    if isinstance(traj_or_segments, Trajectory):
        _raise_drift(tokenizer, "prompt", encode_prompt(tokenizer, traj_or_segments.question, system_prompt), prompt_ids)
        segments = traj_or_segments.segments
    else:
        segments = traj_or_segments
    expected = encode_segments(tokenizer, segments).input_ids
    if response_ids and response_ids[-1] == tokenizer.eos_token_id:
        expected = expected + [tokenizer.eos_token_id]
    _raise_drift(tokenizer, "response", expected, list(response_ids))

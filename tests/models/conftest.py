"""Shared fixtures: a small corpus, a tokenizer trained on it, a 2-layer tiny model, a model that has
memorized one CoA trajectory (so greedy decoding produces a real, well-formed rollout), and a Qwen-like
tokenizer in which the CoA tags are text (`qwen_like_tokenizer`)."""
from __future__ import annotations

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers, trainers
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast

from models.format import Segment, Trajectory, render_segments
from models.tiny import TinyModelConfig, build_tiny_model
from models.tokenizer import train_tokenizer
from tests.conftest import memorize_trajectory

torch.set_num_threads(1)

SYSTEM_PROMPT = "You are a Chain-of-Agents model. Use tags."


def sample_trajectory(idx: int = 0) -> Trajectory:
    return Trajectory(
        id=f"t{idx}",
        question=f"Who founded the company that employs person {idx}?",
        family="multihop",
        segments=[
            Segment("think", f"I need the employer of person {idx}."),
            Segment("plan", "Search the person, then the company."),
            Segment("web_search", f"person {idx} employer"),
            Segment("observation", f"Found 1 results:\n1. [Person {idx}](http://w/p{idx}) works at Acme."),
            Segment("reflection", "Tool effectiveness: good."),
            Segment("web_search", "Acme founder"),
            Segment("observation", "Acme was founded by Alice Smith in 1990."),
            Segment("suggested_answer", "Alice Smith"),
            Segment("double_check", "Score 4: the sources agree."),
            Segment("answer", "Alice Smith"),
        ],
        answer="Alice Smith",
    )


def corpus() -> list[str]:
    texts = []
    for i in range(20):
        t = sample_trajectory(i)
        texts += [t.question, render_segments(t.segments)]
    return texts * 5


@pytest.fixture(scope="session")
def tokenizer():
    return train_tokenizer(corpus(), vocab_size=400)


@pytest.fixture(scope="session")
def tiny_cfg():
    return TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)


@pytest.fixture()
def tiny_model(tokenizer, tiny_cfg):
    return build_tiny_model(tiny_cfg, tokenizer).eval()


@pytest.fixture(scope="session")
def memorized_model(tokenizer, tiny_cfg):
    """A tiny model trained to reproduce sample_trajectory(0) (model tokens only), so greedy decoding with
    tool observations inserted is a genuine multi-turn rollout."""
    return memorize_trajectory(build_tiny_model(tiny_cfg, tokenizer), tokenizer, sample_trajectory(0),
                               SYSTEM_PROMPT, max_steps=150)


# The non-tool branch of Qwen2.5-Instruct's chat template (default system prompt included).
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen2's pre-tokenizer regex (its tokenizer.json): `>I` of `<think>I need` is one pre-token.
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")


def qwen_like_tokenizer() -> PreTrainedTokenizerFast:
    """A real checkpoint's kind of tokenizer, made here: byte-level BPE with Qwen2's pre-tokenizer, ChatML
    specials only (the CoA tags are text), a Qwen2.5-style chat template."""
    backend = Tokenizer(BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  clean_up_tokenization_spaces=False)
    tok.chat_template = QWEN25_TEMPLATE
    return tok

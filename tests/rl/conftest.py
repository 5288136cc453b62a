"""Fixtures for RL tests: an arithmetic task solved with the real sandboxed `code` tool, a tokenizer trained on
its trajectories, and a tiny 2-layer Qwen2 briefly SFT'd on hand-made CoA trajectories (saved as a policy dir).

The SFT is short on purpose: the policy learns the format (think -> code -> answer) but not yet to copy the
observation into the answer every time, so RL has something to improve."""
from __future__ import annotations

import random

import pytest
import torch

from models.format import Segment, Trajectory, render_segments
from models.policy import save_policy
from models.tiny import TinyModelConfig, build_tiny_model
from models.tokenizer import encode_trajectory, train_tokenizer
from problems.records import Problem, write_problems

torch.set_num_threads(1)


def addition_problem(a: int, b: int) -> Problem:
    return Problem(id=f"add-{a}-{b}", question=f"What is {a} plus {b}?", answers=[str(a + b)], family="computation")


def addition_trajectory(a: int, b: int) -> Trajectory:
    s = a + b
    return Trajectory(
        id=f"add-{a}-{b}", question=f"What is {a} plus {b}?", family="computation",
        segments=[
            Segment("think", "Compute it."),
            Segment("code", f"```py\nprint({a}+{b})\n```"),
            Segment("observation", f"[RESULT:SUCCESS]\n{s}\n"),
            Segment("answer", str(s)),
        ],
        answer=str(s),
    )


ALL_PAIRS = [(a, b) for a in range(1, 10) for b in range(1, 10)]


def sft_briefly(model, tokenizer, trajectories, steps: int, lr: float = 3e-3, seed: int = 0):
    """Masked next-token SFT (prompt and observations have no loss), batch 16, seeded."""
    examples = [encode_trajectory(tokenizer, t) for t in trajectories]
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = random.Random(seed)
    model.train()
    for _ in range(steps):
        batch = rng.sample(examples, 16)
        width = max(len(e.input_ids) for e in batch)
        ids = torch.full((16, width), tokenizer.pad_token_id)
        labels = torch.full((16, width), -100)
        att = torch.zeros((16, width), dtype=torch.long)
        for r, e in enumerate(batch):
            ids[r, :len(e.input_ids)] = torch.tensor(e.input_ids)
            att[r, :len(e.input_ids)] = 1
            labels[r, :len(e.input_ids)] = torch.tensor([t if m else -100 for t, m in zip(e.input_ids, e.loss_mask)])
        loss = model(input_ids=ids, attention_mask=att, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="session")
def addition_tokenizer():
    texts = []
    for a, b in ALL_PAIRS:
        t = addition_trajectory(a, b)
        texts += [t.question, render_segments(t.segments)]
    return train_tokenizer(texts, vocab_size=300)


@pytest.fixture(scope="session")
def tiny_cfg():
    return TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)


@pytest.fixture()
def tiny_model(addition_tokenizer, tiny_cfg):
    return build_tiny_model(tiny_cfg, addition_tokenizer).eval()


@pytest.fixture(scope="session")
def sft_policy_dir(tmp_path_factory, addition_tokenizer, tiny_cfg):
    """A saved policy after a brief SFT on the 81 addition trajectories: right format most of the time, right
    answer about a third of the time (measured: reward 0.31 on 32 sampled episodes), so GRPO groups vary."""
    torch.manual_seed(0)
    model = build_tiny_model(tiny_cfg, addition_tokenizer)
    sft_briefly(model, addition_tokenizer, [addition_trajectory(a, b) for a, b in ALL_PAIRS], steps=280)
    return save_policy(model, addition_tokenizer, tmp_path_factory.mktemp("policy") / "sft")


@pytest.fixture(scope="session")
def addition_problems_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("problems") / "addition.jsonl"
    write_problems(path, [addition_problem(a, b) for a, b in ALL_PAIRS])
    return path

"""A hand-made RL task for tests and bench/bench_rl.py: "What is A plus B?" solved with the real `code` tool.

`addition_trajectory` is the CoA trajectory a solver writes (think -> code -> observation -> answer);
`sft_briefly` is a minimal masked-SFT loop (prompt and observations carry no loss) that gives the RL tests a
policy that already writes the format.

    model = sft_briefly(build_tiny_model(cfg, tok), tok, [addition_trajectory(a, b) for a, b in ALL_PAIRS], steps=280)
"""
from __future__ import annotations

import random

import torch

from models.format import Segment, Trajectory, render_segments
from models.tokenizer import encode_trajectory, train_tokenizer
from problems.records import Problem


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


def addition_tokenizer():
    """A byte-level BPE trained on the task's questions and rendered trajectories."""
    texts = []
    for a, b in ALL_PAIRS:
        t = addition_trajectory(a, b)
        texts += [t.question, render_segments(t.segments)]
    return train_tokenizer(texts, vocab_size=300)

"""Fixtures for the AutoCoA tests: a small multihop world with its problems, a tokenizer trained on synthetic CoA
text, and a seeded tiny Qwen2 policy (seconds on CPU)."""
from __future__ import annotations

import pytest
import torch

from models.format import render_segments
from models.tiny import TinyModelConfig, build_tiny_model
from models.tokenizer import train_tokenizer
from training.synthetic_coa import synthetic_trajectories

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tokenizer():
    texts = [t.question + render_segments(t.segments) for t in synthetic_trajectories(48, seed=0)]
    return train_tokenizer(texts, vocab_size=400)


@pytest.fixture
def tiny_model(tokenizer):
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                          max_position_embeddings=512, seed=0)
    return build_tiny_model(cfg, tokenizer)


from tests.teacher.conftest import miniweb, toolbox, toolbox_cfg, world_setup  # noqa: E402,F401 (fixtures)


@pytest.fixture(scope="module")
def teacher_runs(world_setup, toolbox):
    """(problem, trajectory) for every multihop problem of the small world, from the scripted oracle teacher
    through the real MAS and toolbox; mistakes on, so some trajectories carry wrong calls that must not be chosen."""
    from agents.teacher.mas import TeacherConfig, run_mas
    from agents.teacher.oracle import OracleKnowledge, ScriptedOracleBackend
    from distill.conversion import mas_log_to_trajectory

    knowledge = OracleKnowledge(world_setup.problems)
    problems = [p for p in world_setup.problems if p.family == "multihop"]
    return [(p, mas_log_to_trajectory(run_mas(p, ScriptedOracleBackend(knowledge, 0.5, 0.3, seed=i), toolbox,
                                              TeacherConfig())))
            for i, p in enumerate(problems)]


@pytest.fixture(scope="module")
def computation_runs(world_setup, toolbox):
    """(problem, trajectory) of the small world's computation problems: the oracle teacher without mistakes,
    its code run in the real sandbox."""
    from agents.teacher.mas import TeacherConfig, run_mas
    from agents.teacher.oracle import OracleKnowledge, ScriptedOracleBackend
    from distill.conversion import mas_log_to_trajectory

    knowledge = OracleKnowledge(world_setup.problems)
    return [(p, mas_log_to_trajectory(run_mas(p, ScriptedOracleBackend(knowledge, 0.0, 0.0, seed=i), toolbox,
                                              TeacherConfig())))
            for i, p in enumerate(p for p in world_setup.problems if p.family == "computation")]


@pytest.fixture(scope="module")
def dataset_dir(world_setup, teacher_runs, computation_runs, tmp_path_factory):
    """A distill-stage dataset directory of the small world: train.jsonl (the teacher's multi-hop and
    computation trajectories), problems.jsonl (all problems) and eval_heldout.jsonl (a few world problems and a
    computation)."""
    from models.format import write_jsonl
    from problems.records import write_problems

    out = tmp_path_factory.mktemp("dataset")
    write_jsonl(out / "train.jsonl", [traj for _, traj in teacher_runs + computation_runs])
    write_problems(out / "problems.jsonl", world_setup.problems)
    write_problems(out / "eval_heldout.jsonl", [p for p, _ in teacher_runs[:4] + computation_runs[:1]])
    return out

"""The smallest pipeline recipe that still runs every stage for real (overrides of configs/default.yaml)."""
from __future__ import annotations

SMOKE_OVERRIDES = [
    "distill.n_worlds=2", "distill.multihop_per_world=12", "distill.n_computation=8",
    "distill.rl_multihop_per_world=4", "distill.rl_computation=4", "distill.n_heldout_worlds=1",
    "distill.eval_per_world=4", "distill.rollout.num_actors=1",
    "policy.tiny.hidden_size=64", "policy.tiny.num_layers=2", "policy.tiny.num_heads=2",
    "policy.tiny.num_kv_heads=1", "policy.tiny.intermediate_size=128", "policy.vocab_size=600",
    "pretrain.enabled=true", "pretrain.extra_worlds=1", "pretrain.train.max_len=256", "pretrain.train.micro_batch=2",
    "pretrain.train.max_steps=2", "pretrain.train.checkpoint_every=2", "pretrain.train.report_every=2",
    "sft.max_steps=4", "sft.time_budget_s=30", "sft.checkpoint_every=2", "sft.report_every=2",
    "rl.steps=1", "rl.prompts_per_step=2", "rl.rollout.group_size=2", "rl.rollout.max_turns=2",
    "eval.problem_sets.heldout.size=2", "eval.problem_sets.train_entities.size=2",
    "eval.problem_sets.computation.size=1", "eval.n_samples=1", "eval.ks=[1]", "eval.max_turns=2",
]

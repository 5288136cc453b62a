"""Distillation: Ray rollout pool over the teacher MAS, MAS log -> CoA conversion, progressive filtering.

Modules: `pipeline` (distill_dataset, DistillConfig: the whole stage), `rollouts` (Ray actor pool, RolloutConfig),
`rollout_work` (what one actor does, no Ray), `shards` (atomic JSONL shards, resume), `conversion`
(mas_log_to_trajectory), `filters` (progressive filters, run_filters), `rl_problems` (hard-problem selection).
AutoCoA (#23): `autocoa_pairs` (when-to-act pairs, facts-given CoT), `autocoa_data` (write_autocoa_data: its
training and held-out files from a distilled dataset), `react` (the ReAct baseline's trajectories),
`autocoa_import` (AutoCoA's released pair and CoA/CoT message files).
"""

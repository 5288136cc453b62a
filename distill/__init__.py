"""Distillation: Ray rollout pool over the teacher MAS, MAS log -> CoA conversion, progressive filtering."""

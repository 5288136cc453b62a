"""Problem sources: the generated world + mini-web, computation problems, HumanEval, loaders for public formats."""

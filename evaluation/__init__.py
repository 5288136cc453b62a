"""Evaluation and analysis of trained models against the teacher MAS.

Modules:
    records      EvalRecord (one sampled episode) and its JSONL file
    metrics      pass@k (unbiased), accuracy, failure categories, best-of-n, majority vote, TTS curves (pure)
    efficiency   tokens / tool calls per solved problem, model vs teacher, reduction in % (pure)
    grading      episode / MAS log -> graded EvalRecord (judge, numeric match, HumanEval tests in the sandbox)
    report       summary rows, printed table, markdown, PNG plots
    runner       EvalConfig and evaluate(cfg): models + teacher on problem sets, MLflow, promotion gate
    unseen_tools zero-shot use of a tool described only in the prompt (calculator via <code>)
    when_to_act  AutoCoA: pair preference (when-to-act accuracy), acted-when-needed / abstained-when-not rates
    world_model  AutoCoA: fidelity of observations the policy writes itself (token F1, answer fact present)
    promotion    champion / challenger decision and its registry application
    lineage      registry lineage tags and the RL -> SFT -> base walk
"""

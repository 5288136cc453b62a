"""The teacher as an evaluated system, in process and on the distillation stage's Ray actor pool: the same
per-(problem, sample) seeds give the same records either way; and which teacher eval runs."""
from __future__ import annotations

import json

import pytest

from agents.teacher.mas import TeacherConfig
from agents.tools.sandbox import SandboxLimits
from agents.tools.toolbox import ToolboxConfig
from evaluation.teacher_eval import evaluate_teacher, resolve_teacher, teacher_problems
from problems.computation import computation_problems
from problems.humaneval import humaneval_problems
from training.rewards import NormalizedMatchJudge

LIMITS = SandboxLimits(timeout_s=10, cpu_s=10)
TOOLBOX = ToolboxConfig(tools=["code"], code_timeout_s=10)


def test_in_process_teacher_skips_problems_the_oracle_cannot_solve(tmp_path):
    sets = {"computation": computation_problems(2, split="test"), "humaneval": humaneval_problems()[:1]}
    records = evaluate_teacher(sets, TeacherConfig(), TOOLBOX, n_samples=2, ray_actors=0,
                               judge=NormalizedMatchJudge(), limits=LIMITS, scratch_dir=tmp_path)
    assert [(r.problem_set, r.sample) for r in records] == [("computation", 0), ("computation", 1)] * 2
    assert all(r.model == "teacher" and r.tokens > 0 for r in records)


@pytest.mark.slow
@pytest.mark.integration
def test_ray_pool_gives_the_same_records_as_in_process(tmp_path):
    import ray

    sets = {"computation": computation_problems(2, split="test")}
    local = evaluate_teacher(sets, TeacherConfig(), TOOLBOX, n_samples=2, ray_actors=0,
                             judge=NormalizedMatchJudge(), limits=LIMITS, scratch_dir=tmp_path / "a")
    try:
        pooled = evaluate_teacher(sets, TeacherConfig(), TOOLBOX, n_samples=2, ray_actors=1,
                                  judge=NormalizedMatchJudge(), limits=LIMITS, scratch_dir=tmp_path / "b")
    finally:
        ray.shutdown()
    assert [r.to_dict() for r in pooled] == [r.to_dict() for r in local]
    assert list((tmp_path / "b" / "teacher_logs" / "computation").glob("*.jsonl"))


def test_the_teacher_row_is_the_configured_teacher(tmp_path):
    """Eval's teacher is the one named in the eval config, else the one that distilled the dataset (its
    report.json), and the scripted oracle only when nothing else is configured."""
    data = tmp_path / "dataset"
    data.mkdir()
    llm = TeacherConfig(backend="openai", endpoint="http://127.0.0.1:9/v1", model="qwen-72b")
    (data / "report.json").write_text(json.dumps({"counts": {}, "teacher": llm.model_dump(mode="json")}))
    sources = ["computation", str(data / "eval_heldout.jsonl")]
    assert resolve_teacher(None, sources) == llm
    explicit = TeacherConfig(mistake_rate=0.0)
    assert resolve_teacher(explicit, sources) is explicit
    assert resolve_teacher(None, ["computation", "s3://afm/x.jsonl"]) == TeacherConfig()
    # with an LLM teacher every problem gets a teacher row, not only those the oracle can solve
    sets = computation_problems(1, split="test") + humaneval_problems()[:1]
    assert len(teacher_problems(sets, llm)) == 2 and len(teacher_problems(sets, TeacherConfig())) == 1

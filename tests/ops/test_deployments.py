"""Prefect deployments: prefect.yaml and flows/deployments.py declare the same seven deployments, every entrypoint
loads a flow whose parameter schema is its pydantic config (so the UI shows a form), the nightly cron fires at
02:00 UTC, the pull step's `{{ $AFM_REPO_DIR }}` resolves, and (integration) `register_deployments` creates the
work pool and deployments on a real temporary Prefect server, read back through the API, printing nothing
(`afm deploy` prints one summary instead of Prefect's seven banners and tables).

    .venv/bin/pytest tests/ops -q                       # unit tests, seconds
    .venv/bin/pytest tests/ops -q -m integration        # + a temporary Prefect server (~40 s on 2 cores)
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from datetime import datetime, timezone

import pytest
import yaml
from prefect import Flow
from prefect.flows import load_flow_from_entrypoint
from prefect.utilities.callables import parameter_schema

from afm.config import read_yaml
from flows.deployments import DEFAULT_RECIPE, DEPLOYMENTS, NIGHTLY_CRON, REPO_ROOT, deployment_parameters, \
    deployment_summary
from flows.distill import DistillFlowConfig
from flows.evaluate import EvalFlowConfig
from flows.pipeline import PipelineConfig
from flows.rl import RLFlowConfig
from flows.sft import SFTFlowConfig

CONFIG_OF = {"pipeline": PipelineConfig, "nightly-retrain": PipelineConfig, "autocoa": PipelineConfig, "distill": DistillFlowConfig,
             "sft": SFTFlowConfig, "rl": RLFlowConfig, "evaluate": EvalFlowConfig}


@pytest.fixture(scope="module")
def prefect_yaml() -> dict:
    return yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())


def assert_schema_is_config(schema: dict, config_cls) -> None:
    """The `config` parameter refers to the config class and lists exactly its fields (typed, with defaults)."""
    config_param = schema["properties"]["config"]
    assert config_param["$ref"] == f"#/definitions/{config_cls.__name__}"
    definition = schema["definitions"][config_cls.__name__]
    assert set(definition["properties"]) == set(config_cls.model_fields)
    assert definition["additionalProperties"] is False  # Config forbids unknown fields; the form does too


def test_prefect_yaml_declares_the_same_deployments(prefect_yaml):
    declared = {d["name"]: d["entrypoint"] for d in prefect_yaml["deployments"]}
    assert declared == {spec.name: spec.entrypoint for spec in DEPLOYMENTS}
    assert {d["work_pool"]["name"] for d in prefect_yaml["deployments"]} == {"afm-process"}
    nightly = next(d for d in prefect_yaml["deployments"] if d["name"] == "nightly-retrain")
    assert nightly["schedules"] == [{"cron": NIGHTLY_CRON, "timezone": "UTC", "active": True}]


@pytest.mark.parametrize("spec", DEPLOYMENTS, ids=lambda spec: spec.name)
def test_entrypoint_loads_flow_with_config_schema(spec):
    loaded = load_flow_from_entrypoint(spec.entrypoint, use_placeholder_flow=False)
    assert isinstance(loaded, Flow)
    assert loaded.name == spec.name
    assert_schema_is_config(parameter_schema(loaded).model_dump(), CONFIG_OF[spec.name])


@pytest.mark.slow
def test_from_source_in_a_fresh_interpreter_keeps_typed_schemas():
    """What `afm deploy` does, in a process that has imported nothing of ours: a file-path entrypoint would
    shadow the `distill` package with flows/distill.py and degrade the schema to an untyped placeholder."""
    script = textwrap.dedent(f"""
        import json
        from prefect import flow
        from prefect.utilities.callables import parameter_schema
        refs = {{}}
        for entrypoint in {[spec.entrypoint for spec in DEPLOYMENTS]!r}:
            loaded = flow.from_source(source={str(REPO_ROOT)!r}, entrypoint=entrypoint)
            refs[entrypoint] = parameter_schema(loaded).model_dump()["properties"]["config"].get("$ref")
        print(json.dumps(refs))
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd="/", capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    refs = json.loads(result.stdout.strip().splitlines()[-1])
    assert refs == {spec.entrypoint: f"#/definitions/{CONFIG_OF[spec.name].__name__}" for spec in DEPLOYMENTS}


@pytest.mark.parametrize("spec", DEPLOYMENTS, ids=lambda spec: spec.name)
def test_recipe_parameters_fit_the_config(spec):
    params = deployment_parameters(spec, read_yaml(spec.recipe))
    config = CONFIG_OF[spec.name].model_validate(params["config"])
    if spec.recipe_section == "distill":
        assert config.distill.n_worlds == read_yaml(DEFAULT_RECIPE)["distill"]["n_worlds"]


def test_nightly_cron_next_run_is_0200_utc():
    from prefect.server.schemas.schedules import CronSchedule

    schedule = CronSchedule(cron=NIGHTLY_CRON, timezone="UTC")
    start = datetime(2026, 3, 28, 13, 5, tzinfo=timezone.utc)  # the eve of the EU DST switch: UTC has none
    dates = asyncio.run(schedule.get_dates(n=3, start=start))
    assert [d.astimezone(timezone.utc) for d in dates] == [
        datetime(2026, 3, day, 2, 0, tzinfo=timezone.utc) for day in (29, 30, 31)]


def test_pull_step_sets_working_directory_from_env(prefect_yaml, tmp_path, monkeypatch):
    """`{{ $AFM_REPO_DIR }}` is filled from the environment the way `prefect deploy` and the worker's run_step
    do (apply_values with os.environ), and the resulting step moves the run into that directory."""
    from prefect.deployments.steps import set_working_directory
    from prefect.utilities.templating import apply_values

    monkeypatch.chdir(REPO_ROOT)  # restored after the test; the step chdirs
    monkeypatch.setenv("AFM_REPO_DIR", str(tmp_path))
    [step] = apply_values(prefect_yaml["pull"], os.environ)
    inputs = step["prefect.deployments.steps.set_working_directory"]
    assert inputs == {"directory": str(tmp_path)}
    set_working_directory(**inputs)
    assert os.getcwd() == str(tmp_path)


@pytest.mark.integration
@pytest.mark.slow
def test_register_deployments_on_a_real_server(capfd):
    from prefect.client.orchestration import get_client
    from prefect.testing.utilities import prefect_test_harness

    from flows.deployments import register_deployments

    async def read_back():
        async with get_client() as client:
            pool = await client.read_work_pool("afm-ops-test")
            deployments = {d.name: d for d in await client.read_deployments()}
            return pool, deployments

    with prefect_test_harness(server_startup_timeout=90):
        capfd.readouterr()
        first = register_deployments("afm-ops-test")
        assert capfd.readouterr().out == ""  # Prefect's per-deployment banners and tables are swallowed
        again = register_deployments("afm-ops-test")  # idempotent: updates in place
        pool, deployments = asyncio.run(read_back())

    assert pool.type == "process"
    assert first == again
    assert set(deployments) == {spec.name for spec in DEPLOYMENTS}
    for spec in DEPLOYMENTS:
        deployment = deployments[spec.name]
        assert str(deployment.id) == first[spec.name]
        assert deployment.work_pool_name == "afm-ops-test"
        assert deployment.entrypoint == spec.entrypoint
        assert deployment.pull_steps == [
            {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO_ROOT)}}]
        assert deployment.parameters == deployment_parameters(spec, read_yaml(spec.recipe))
        assert_schema_is_config(deployment.parameter_openapi_schema, CONFIG_OF[spec.name])
        crons = [(s.schedule.cron, s.schedule.timezone, s.active) for s in deployment.schedules]
        assert crons == ([(NIGHTLY_CRON, "UTC", True)] if spec.cron else [])


def test_deploy_summary_is_one_line_per_deployment():
    ids = {spec.name: f"id-{spec.name}" for spec in DEPLOYMENTS}
    lines = deployment_summary(ids, "afm-process", "http://127.0.0.1:4200/api").splitlines()
    assert lines[0] == "7 deployments on http://127.0.0.1:4200/api, work pool 'afm-process':"
    assert len(lines) == len(DEPLOYMENTS) + 2 and lines[-1].startswith("Next: prefect worker start --pool afm-process")
    nightly = next(line for line in lines if "nightly-retrain/nightly-retrain" in line)
    assert "id-nightly-retrain" in nightly and f"cron '{NIGHTLY_CRON}' UTC" in nightly

"""Register every flow as a Prefect deployment on the running server (`afm deploy`), with a process work pool.

    afm stack up && source .afm/stack/env.sh && afm deploy
    prefect worker start --pool afm-process          # then trigger runs from the UI (http://127.0.0.1:4200)
    prefect deployment run 'distill/distill' --param config='{"distill": {"n_worlds": 2}}'

The deployments load the code from this checkout (`flow.from_source(<repo root>, entrypoint)`: Prefect stores a
`set_working_directory: <repo root>` pull step), so a process worker on this machine runs them as they are; on a
cluster, point `source` at the repo/image the workers have. Each deployment's parameter schema is the flow's
pydantic config (the UI renders it as a form) and its default parameters come from the recipe
(configs/default.yaml; configs/autocoa.yaml for `autocoa`): the whole recipe for `pipeline`/`nightly-retrain`/`autocoa`,
the stage's section for the others.
`prefect.yaml` declares the same deployments for `prefect deploy --all`. See docs/operations.md.

Output: Prefect's `deploy` prints a "Successfully created/updated" banner and a table per deployment; that is
captured (and shown on stderr only if registration fails), and `afm deploy` prints one summary
(`deployment_summary`).
"""
from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass
from pathlib import Path

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.schedules import CronSchedule
from prefect.exceptions import ObjectNotFound
from prefect.utilities.asyncutils import run_coro_as_sync

from afm.config import read_yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RECIPE = REPO_ROOT / "configs" / "default.yaml"
AUTOCOA_RECIPE = REPO_ROOT / "configs" / "autocoa.yaml"
NIGHTLY_CRON = "0 2 * * *"
NIGHTLY_TIMEZONE = "UTC"


@dataclass(frozen=True)
class DeploymentSpec:
    """One deployment: its name, the flow's entrypoint and which part of the recipe becomes its parameters."""

    name: str
    entrypoint: str
    recipe_section: str | None  # None: the whole recipe (pipeline flows); else the stage's section
    cron: str | None = None
    description: str = ""
    recipe: Path = DEFAULT_RECIPE  # the YAML recipe its default parameters come from


DEPLOYMENTS = (
    DeploymentSpec("pipeline", "flows.pipeline.pipeline_flow", None,
                   description="distill -> sft -> rl -> evaluate -> promote on the recipe's data"),
    DeploymentSpec("nightly-retrain", "flows.nightly.nightly_retrain_flow", None, NIGHTLY_CRON,
                   description="the pipeline on fresh data every night at 02:00 UTC; the champion alias moves "
                               "only on improvement"),
    DeploymentSpec("autocoa", "flows.pipeline.autocoa_flow", None, recipe=AUTOCOA_RECIPE,
                   description="AutoCoA: distill -> SFT1 when-to-act -> SFT2 -> SFT3 world model -> simulated RL -> "
                               "real RL -> evaluate next to AFM and ReAct (flows/autocoa.py)"),
    DeploymentSpec("distill", "flows.distill.distill_flow", "distill",
                   description="teacher rollouts -> CoA trajectories -> progressive filters -> dataset"),
    DeploymentSpec("sft", "flows.sft.sft_flow", "sft",
                   description="SFT on Ray Train; set sft.model_path and sft.dataset"),
    DeploymentSpec("rl", "flows.rl.rl_flow", "rl",
                   description="agentic RL (GRPO/DAPO); set dataset_uri and rl.policy"),
    DeploymentSpec("evaluate", "flows.evaluate.evaluate_flow", "eval",
                   description="evaluate models side by side and promote on improvement; set dataset_uri and "
                               "eval.models"),
)


async def ensure_work_pool(name: str) -> bool:
    """Create the process work pool `name` unless it exists; True when it was created."""
    async with get_client() as client:
        try:
            await client.read_work_pool(name)
            return False
        except ObjectNotFound:
            await client.create_work_pool(WorkPoolCreate(name=name, type="process"))
            return True


def deployment_parameters(spec: DeploymentSpec, recipe: dict) -> dict:
    """The deployment's default parameters: `{"config": <whole recipe or the stage's section>}`.

    Stage flows wrap their section the way their config does (DistillFlowConfig.distill, SFTFlowConfig.sft, ...).
    Fields the pipeline normally fills in (sft.model_path, rl.policy, ...) are left for the person triggering.
    """
    if spec.recipe_section is None:
        return {"config": recipe}
    return {"config": {spec.recipe_section: recipe.get(spec.recipe_section, {})}}


def register_deployments(work_pool: str, recipe: Path | None = None) -> dict[str, str]:
    """Create `work_pool` (process) if missing and create/update every deployment; returns name -> deployment id.

    `recipe`: one YAML recipe for every deployment instead of each one's own (`DeploymentSpec.recipe`).
    Needs PREFECT_API_URL pointing at a running server (env.sh of `afm stack up` sets it). Re-running updates the
    deployments in place (same names, same ids).
    """
    run_coro_as_sync(ensure_work_pool(work_pool))
    with _prefect_output_only_on_failure():
        return {spec.name: _deploy(spec, work_pool, read_yaml(recipe or spec.recipe)) for spec in DEPLOYMENTS}


@contextlib.contextmanager
def _prefect_output_only_on_failure():
    """Swallow what Prefect prints on stdout (its console resolves sys.stdout when it prints); on an error,
    replay it on stderr, since it may say what went wrong."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            yield
    except BaseException:
        sys.stderr.write(captured.getvalue())
        raise


def _deploy(spec: DeploymentSpec, work_pool: str, recipe_data: dict) -> str:
    # Module-path entrypoints, not `flows/distill.py:distill_flow`: Prefect loads a file path as a script with
    # flows/ first on sys.path, where flows/distill.py shadows the `distill` package; the import fails and
    # Prefect silently falls back to an AST-parsed placeholder whose parameter schema is untyped (no form).
    # Loading imports the module, so a flow that does not import fails here, not in the worker.
    loaded = flow.from_source(source=str(REPO_ROOT), entrypoint=spec.entrypoint)
    schedules = [CronSchedule(cron=spec.cron, timezone=NIGHTLY_TIMEZONE)] if spec.cron else None
    return str(loaded.deploy(
        name=spec.name, work_pool_name=work_pool, schedules=schedules,
        parameters=deployment_parameters(spec, recipe_data), description=spec.description,
        tags=["afm"] + (["scheduled"] if spec.cron else []), print_next_steps=False,
        ignore_warnings=True,  # the "use .serve for local development" hint; a worker is what we want
    ))


def deployment_summary(ids: dict[str, str], work_pool: str, api_url: str) -> str:
    """What `afm deploy` prints: one line per deployment (name, id, schedule) and how to start a worker."""
    specs = {spec.name: spec for spec in DEPLOYMENTS}
    width = max(len(f"{name}/{name}") for name in ids)
    lines = [f"{len(ids)} deployments on {api_url or 'the Prefect API'}, work pool {work_pool!r}:"]
    for name, deployment_id in ids.items():
        cron = specs[name].cron
        schedule = f"  cron '{cron}' {NIGHTLY_TIMEZONE}" if cron else ""
        lines.append(f"  {f'{name}/{name}':<{width}}  {deployment_id}{schedule}")
    lines.append(f"Next: prefect worker start --pool {work_pool}   (then run them from the UI or "
                 f"`prefect deployment run 'distill/distill'`)")
    return "\n".join(lines)

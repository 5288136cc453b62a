"""Register every flow as a Prefect deployment on the running server (`afm deploy`), with a process work pool.

    afm stack up && source .afm/stack/env.sh && afm deploy
    prefect worker start --pool afm-process          # then trigger runs from the UI (http://127.0.0.1:4200)

The deployments load the code from this checkout (`flow.from_source(<repo root>, entrypoint)`), so a worker on
this machine runs them as they are; on a cluster, point `source` at the repo/image the workers have.
Parameters are the flows' typed configs, so the UI shows them as forms; defaults come from configs/default.yaml.
"""
from __future__ import annotations

from pathlib import Path

import yaml
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.exceptions import ObjectNotFound
from prefect.utilities.asyncutils import run_coro_as_sync

REPO_ROOT = Path(__file__).resolve().parents[1]
NIGHTLY_CRON = "0 2 * * *"  # 02:00 UTC

# (deployment name, entrypoint, config section of configs/default.yaml used as its parameters, cron)
DEPLOYMENTS = [
    ("pipeline", "flows/pipeline.py:pipeline_flow", None, None),
    ("nightly-retrain", "flows/nightly.py:nightly_retrain_flow", None, NIGHTLY_CRON),
    ("distill", "flows/distill.py:distill_flow", "distill", None),
    ("sft", "flows/sft.py:sft_flow", "sft", None),
    ("rl", "flows/rl.py:rl_flow", "rl", None),
    ("evaluate", "flows/evaluate.py:evaluate_flow", "eval", None),
]


async def _ensure_work_pool(name: str) -> None:
    async with get_client() as client:
        try:
            await client.read_work_pool(name)
        except ObjectNotFound:
            await client.create_work_pool(WorkPoolCreate(name=name, type="process"))


def deployment_parameters(section: str | None, recipe: Path) -> dict:
    """Flow parameters from the recipe: the whole recipe for pipeline flows, one section for stage flows."""
    data = yaml.safe_load(recipe.read_text()) or {}
    if section is None:
        return {"config": data}
    return {"config": {section: data.get(section, {})}}


def register_deployments(work_pool: str, recipe: Path = REPO_ROOT / "configs" / "default.yaml") -> dict[str, str]:
    run_coro_as_sync(_ensure_work_pool(work_pool))
    ids = {}
    for name, entrypoint, section, cron in DEPLOYMENTS:
        remote = flow.from_source(source=str(REPO_ROOT), entrypoint=entrypoint)
        ids[name] = str(remote.deploy(
            name=name, work_pool_name=work_pool, cron=cron, parameters=deployment_parameters(section, recipe),
            tags=["afm"], print_next_steps=False,
        ))
    return ids

"""Start a local Ray the platform's way: no dashboard (memory and ports a 2-core box does not spare), and the
one warning that a dashboard-less Ray Train run repeats every second silenced.

    from afm.ray_local import init_local_ray
    init_local_ray(num_cpus=2)      # callers that honour RAY_ADDRESS connect there instead
"""
from __future__ import annotations

import logging

import ray

# Ray Train v2 starts a PlacementGroupCleaner actor that asks the State API (served by the dashboard) once a
# second whether the train controller is alive. Without a dashboard each ask fails and logs a warning: 1,757
# lines in one 29-minute SFT stage. Raising that one logger to ERROR removes the flood; it does NOT restore
# what the cleaner is for (freeing a placement group when the controller dies while the driver lives on): a
# local Ray's placement groups go away with the process that started it.
PLACEMENT_GROUP_CLEANER_LOGGER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"


def quiet_placement_group_cleaner() -> None:
    """Ray worker setup hook (runs in every worker process before its task or actor)."""
    logging.getLogger(PLACEMENT_GROUP_CLEANER_LOGGER).setLevel(logging.ERROR)


def init_local_ray(num_cpus: int | None = None) -> None:
    """ray.init a local single-node cluster without the dashboard; workers run `quiet_placement_group_cleaner`."""
    ray.init(num_cpus=num_cpus, include_dashboard=False,
             runtime_env={"worker_process_setup_hook": f"{__name__}.quiet_placement_group_cleaner"})

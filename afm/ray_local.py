"""Start a local Ray the platform's way: no dashboard (memory and ports a 2-core box does not spare), the
one warning that a dashboard-less Ray Train run repeats every second silenced, and Ray Train's controller
polling its workers every 0.2 s instead of 2 s.

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


# Ray Train v2's controller learns of a worker group's start, of each `ray.train.report` and of the training
# function's end only when it polls the workers, every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (default 2 s), and a
# report waits until the controller has taken the previous one. Measured here (2 cores): an empty
# `TorchTrainer.fit` 12.4-12.8 s at 2 s, 7.4-7.8 s at 0.2 s; six back-to-back reports 2.0 s each vs 0.2 s.
# A pipeline runs several short fits (pretrain, SFT, RL, AutoCoA's five), so the lag is a real share of a
# small job's time. Only the local Ray gets it: a cluster's Ray keeps its 2 s, where polls of many workers
# cost more and seconds per fit matter less.
TRAIN_POLL_INTERVAL_S = "0.2"


def quiet_placement_group_cleaner() -> None:
    """Ray worker setup hook (runs in every worker process before its task or actor)."""
    logging.getLogger(PLACEMENT_GROUP_CLEANER_LOGGER).setLevel(logging.ERROR)


def init_local_ray(num_cpus: int | None = None) -> None:
    """ray.init a local single-node cluster without the dashboard; workers run `quiet_placement_group_cleaner`
    and Ray Train polls every TRAIN_POLL_INTERVAL_S."""
    ray.init(num_cpus=num_cpus, include_dashboard=False,
             runtime_env={"worker_process_setup_hook": f"{__name__}.quiet_placement_group_cleaner",
                          "env_vars": {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": TRAIN_POLL_INTERVAL_S}})

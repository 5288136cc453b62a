"""SFT on Ray Train with 2 CPU workers (DDP over gloo): trains, checkpoints, registers the policy."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from models.policy import load_policy


@pytest.fixture
def ray_cluster(monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    from afm.ray_local import init_local_ray

    init_local_ray(num_cpus=2)  # as the pipeline starts it
    yield
    ray.shutdown()


@pytest.mark.integration
def test_local_ray_workers_silence_the_placement_group_cleaner_and_poll_train_workers_often(ray_cluster):
    # Without a dashboard Ray Train's PlacementGroupCleaner warned once a second for a whole SFT stage; and at
    # Ray's 2-s poll an empty TorchTrainer.fit took ~5 s longer (afm/ray_local.py). Ray Train's controller is an
    # actor of this job: it gets the job's runtime_env as this task does.
    import logging
    import os

    import ray

    from afm.ray_local import PLACEMENT_GROUP_CLEANER_LOGGER, TRAIN_POLL_INTERVAL_S

    @ray.remote
    def worker_settings() -> tuple[int, str | None]:
        return (logging.getLogger(PLACEMENT_GROUP_CLEANER_LOGGER).getEffectiveLevel(),
                os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"))

    assert ray.get(worker_settings.remote()) == (logging.ERROR, TRAIN_POLL_INTERVAL_S)


@pytest.mark.integration
@pytest.mark.slow
def test_two_worker_ray_run_trains_and_registers(sft_cfg, policy_dir, ray_cluster, tmp_path):
    from training.sft_ray import train_sft

    cfg = sft_cfg.model_copy(update={"num_workers": 2, "max_steps": 4, "checkpoint_every": 2, "keep_last": 1,
                                     "checkpoint_uri": str(tmp_path / "ray_storage")})
    result = train_sft(cfg)
    assert result.steps == 4 and result.data.examples == 48
    history = MlflowClient().get_metric_history(result.run_id, "loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]
    before, _ = load_policy(policy_dir)
    after, _ = load_policy(result.policy_dir)
    assert all(not torch.equal(p, q) for p, q in zip(before.parameters(), after.parameters()))
    kept = [p for p in Path(cfg.checkpoint_uri).rglob("trainer_state.json")]
    assert len(kept) == 1  # keep_last=1: the step-2 checkpoint was deleted by Ray
    assert len(list(kept[0].parent.glob("*.distcp"))) == 2  # one shard per worker, merged by Ray Train
    assert not list(Path(cfg.checkpoint_uri).rglob("model.safetensors"))  # the policy was moved out, not copied
    assert MlflowClient().get_model_version("afm-sft-test", result.model_version).run_id == result.run_id

    # 2 workers x micro_batch 2 see the same 4 rows per step as 1 worker x micro_batch 4, and the loss is
    # token-weighted over both workers: the runs must agree.
    from training.sft_trainer import run_sft_local

    local = run_sft_local(sft_cfg.model_copy(update={"micro_batch": 4, "max_steps": 4, "output_dir": str(tmp_path / "local")}))
    assert abs(local.final_loss - result.final_loss) < 1e-5
    single, _ = load_policy(local.policy_dir)
    for p, q in zip(single.parameters(), after.parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4)


def test_cpu_workers_get_the_clusters_cores(sft_cfg, ray_cluster):
    """Ray sets a worker's torch thread count to its CPU reservation: one worker must reserve both cores."""
    from training.sft_ray import cpus_per_worker

    assert cpus_per_worker(sft_cfg.model_copy(update={"num_workers": 1})) == 2
    assert cpus_per_worker(sft_cfg.model_copy(update={"num_workers": 2})) == 1
    assert cpus_per_worker(sft_cfg.model_copy(update={"num_workers": 1, "cpus_per_worker": 1})) == 1

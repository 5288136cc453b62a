"""Distributed RL on a local Ray: the rollout pool (actors, weight sync, faults) and the learner group's restart.

Integration tests with real Ray actors, real sandboxed tools and Ray Train, on the tiny addition-task policy."""
from __future__ import annotations

import threading
import time

import psutil
import pytest
import torch

from agents.tools.toolbox import ToolboxConfig
from models.policy import load_policy
from problems.records import read_problems
from training.rl_learner import weights_checksum
from training.rl_pool import PoolConfig, RolloutPool
from training.rl_rollout import RolloutConfig
from training.rl_trainer import RLConfig, train_rl

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROLLOUT = RolloutConfig(group_size=4, max_turns=3, max_new_tokens=40, token_budget=200)


@pytest.fixture()
def ray_cluster(monkeypatch, tmp_path):
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("AFM_HOME", str(tmp_path / "afm_home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from afm.ray_local import init_local_ray

    init_local_ray(num_cpus=2)
    yield
    ray.shutdown()


def toolbox(cache) -> ToolboxConfig:
    return ToolboxConfig(tools=["code"], code_timeout_s=5, cache_dir=cache)


def key(ep) -> tuple:
    return ep.prompt_index, ep.sample_index


def _pid_or_none(actor) -> int | None:
    import ray

    try:
        return ray.get(actor.pid.remote(), timeout=30)
    except Exception:  # dead or restarting: not answering yet
        return None


def test_every_sync_reaches_every_actor_even_a_restarted_one(ray_cluster, sft_policy_dir, tmp_path):
    import ray

    pool = RolloutPool(PoolConfig(rollout_workers=2), sft_policy_dir, toolbox(tmp_path / "cache"))
    try:
        model, _ = load_policy(sft_policy_dir)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        for round_ in range(3):
            for tensor in state.values():
                tensor.add_(0.01 * (round_ + 1))
            pool.sync(state)
            assert pool.checksums() == [weights_checksum(state)] * 2
        old_pid = ray.get(pool.actors[1].pid.remote())
        ray.kill(pool.actors[1], no_restart=False)  # Ray restarts it with the start policy (version 0)
        # ray.kill is asynchronous: a call sent at once can still reach the old process, so wait for the new one
        deadline = time.monotonic() + 120
        while _pid_or_none(pool.actors[1]) in (old_pid, None):
            assert time.monotonic() < deadline, "Ray did not restart the killed actor within 120 s"
            time.sleep(0.5)
        with pytest.raises(Exception, match="holds weights v0"):
            ray.get(pool.actors[1].rollout.remote(pool.version, [], [], ROLLOUT, 0))  # stale: refuses work
        pool._resync(1)
        assert pool.checksums() == [weights_checksum(state)] * 2
    finally:
        pool.shutdown()


def test_killing_a_rollout_actor_mid_step_loses_and_duplicates_no_episode(ray_cluster, sft_policy_dir,
                                                                          addition_problems_path, tmp_path):
    import ray

    problems = read_problems(addition_problems_path)[:6]
    pool = RolloutPool(PoolConfig(rollout_workers=2), sft_policy_dir, toolbox(tmp_path / "cache"))
    try:
        model, _ = load_policy(sft_policy_dir)
        pool.sync(model.state_dict())
        calm = pool.rollout(problems, list(range(6)), ROLLOUT, seed=5)
        victim = pool.actors[0]
        pid = ray.get(victim.pid.remote())
        # SIGKILL (as an OOM kill would) while its unit is in flight: a unit is a generate call per turn for 12
        # episodes plus sandboxed tool calls, far longer than 50 ms.
        killer = threading.Timer(0.05, lambda: psutil.Process(pid).kill())
        killer.start()
        hit = pool.rollout(problems, list(range(6)), ROLLOUT, seed=5)
        killer.join()
        assert pool.resubmitted == 1, "the killed actor's unit must run again, once"
        assert ray.get(victim.pid.remote()) != pid  # a restarted process
        assert sorted(map(key, hit)) == sorted(map(key, calm)) == [(p, s) for p in range(6) for s in range(4)]
        # the resubmitted unit ran with the same seeds and synced weights: the same episodes
        assert [ep.response_ids for ep in hit] == [ep.response_ids for ep in calm]
    finally:
        pool.shutdown()


def rl_cfg(policy, problems, out, cache, **update) -> RLConfig:
    return RLConfig(
        policy=str(policy), problems_path=str(problems), output_dir=str(out), steps=5, prompts_per_step=3,
        rollout=ROLLOUT, toolbox=toolbox(cache), lr=1e-3, checkpoint_every=1, seed=2, keep_last=2,
        mlflow_experiment="rl-test", registered_model_name="afm-rl-test",
    ).model_copy(update=update)


def _learner_pids() -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if "RayTrainWorker" in " ".join(p.info["cmdline"] or [])]


def test_a_killed_learner_resumes_from_the_last_checkpoint(ray_cluster, sft_policy_dir, addition_problems_path,
                                                           tmp_path):
    cache = tmp_path / "tool-cache"
    straight = train_rl(rl_cfg(sft_policy_dir, addition_problems_path, tmp_path / "straight", cache))
    storage = tmp_path / "killed" / "ray" / "rl"
    killed_pids: list[int] = []

    def kill_after_second_checkpoint() -> None:
        deadline = time.time() + 300
        while time.time() < deadline:
            if len(list(storage.glob("checkpoint_*/trainer_state.json"))) >= 2 and (pids := _learner_pids()):
                for pid in pids:
                    psutil.Process(pid).kill()
                killed_pids.extend(pids)
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_after_second_checkpoint, daemon=True)
    killer.start()
    resumed = train_rl(rl_cfg(sft_policy_dir, addition_problems_path, tmp_path / "killed", cache))
    killer.join(timeout=1)
    assert killed_pids, "the learner finished before it could be killed"
    assert [h["step"] for h in resumed.history] == list(range(5))  # each step once in the checkpointed history
    a, _ = load_policy(straight.model_dir)
    b, _ = load_policy(resumed.model_dir)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name


def test_two_rollout_actors_and_two_learners_give_the_parameters_of_one_and_one(
        ray_cluster, sft_policy_dir, addition_problems_path, tmp_path):
    cache = tmp_path / "tool-cache"  # the same programs give the same observations in both runs
    small = train_rl(rl_cfg(sft_policy_dir, addition_problems_path, tmp_path / "one", cache, steps=1))
    wide = train_rl(rl_cfg(sft_policy_dir, addition_problems_path, tmp_path / "two", cache, steps=1, num_learners=2,
                           pool=PoolConfig(rollout_workers=2)))
    assert small.history[0]["groups_kept"] >= 1
    for key in ("reward_mean", "groups_sampled", "response_tokens_mean"):
        assert wide.history[0][key] == small.history[0][key], key  # the same episodes
    # The same gradient: its loss and norm catch a lost rank's rows or a wrong scale, which Adam's first step
    # (lr * g / (|g| + eps), scale-free) would hide in the parameters.
    for key in ("loss", "grad_norm"):
        assert wide.history[0][key] == pytest.approx(small.history[0][key], rel=1e-5), key
    a, _ = load_policy(small.model_dir)
    b, _ = load_policy(wide.model_dir)
    # Tolerance lr / 100: the gradient sums come in another order (two ranks' partial sums, gloo's all-reduce),
    # and Adam's first step turns that ~1e-7 relative difference into up to lr * |dg| / eps where |g| is near
    # eps. Measured on an AVX512/AMX host: one of 93.5k parameters moved 5.3e-6 (lr 1e-3), the rest under 1.5e-6.
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(q, p, atol=1e-5, rtol=1e-5, msg=name)

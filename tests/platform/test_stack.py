"""The local stack end to end: up on free ports, a Prefect flow whose MLflow run logs an artifact that lands
in the S3 bucket, a Ray task on the head, status, down (idempotent, in seconds and without SIGKILL even with a
Ray driver still attached), and no recorded process left."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

import boto3
import pytest

from afm.processes import group_members
from afm.stack import StackConfig, StackError, stack_down, stack_status, stack_up
from tests.conftest import free_port

FLOW_SCRIPT = textwrap.dedent('''
    import os

    import ray
    from prefect import flow, task

    from afm import tracking
    from afm.storage import open_store

    @task
    def square_on_ray(x: int) -> int:
        ray.init()  # RAY_ADDRESS (and the auth token) come from the stack's env
        try:
            return ray.get(ray.remote(lambda v: v * v).remote(x))
        finally:
            ray.shutdown()

    @flow
    def smoke_flow() -> str:
        with tracking.start_run("stack-smoke", "smoke", params={"x": 3}) as run:
            tracking.log_metrics({"square": square_on_ray(3)}, step=0)
            tracking.log_table_rows([{"ok": True}], "rows.json")
            open_store(os.environ["AFM_STORE_URI"]).put_bytes("smoke/ok.txt", b"ok")
            return run.info.run_id

    if __name__ == "__main__":
        print("RUN_ID=" + smoke_flow())
''')

# A driver that stays attached to the stack's Ray with a live actor (a notebook, a Prefect worker's flow).
ATTACHED_DRIVER = textwrap.dedent('''
    import time

    import ray

    @ray.remote
    class Pinger:
        def ping(self):
            return "up"

    ray.init()
    actor = Pinger.remote()
    print(ray.get(actor.ping.remote()), flush=True)
    time.sleep(600)
''')


@pytest.fixture
def stack_cfg():
    # Short path: Ray's AF_UNIX socket paths under the state dir must stay below 108 bytes.
    state_dir = Path(tempfile.mkdtemp(prefix="afm-", dir="/tmp"))
    cfg = StackConfig(state_dir=state_dir, mlflow_db=state_dir / "mlflow.db", s3_port=free_port(),
                      mlflow_port=free_port(), prefect_port=free_port(), ray_port=free_port())
    yield cfg
    stack_down(cfg)
    shutil.rmtree(state_dir, ignore_errors=True)


def test_long_state_dir_is_refused(tmp_path):
    with pytest.raises(StackError, match="too long for Ray"):
        stack_up(StackConfig(state_dir=tmp_path / ("x" * 60)))


def test_status_and_down_without_stack(tmp_path):
    cfg = StackConfig(state_dir=tmp_path)
    assert {name: s["running"] for name, s in stack_status(cfg).items()} == {
        "s3": False, "mlflow": False, "prefect": False, "ray": False}
    assert stack_down(cfg) == {}


@pytest.mark.integration
@pytest.mark.slow
def test_stack_up_flow_down(stack_cfg):
    env = stack_up(stack_cfg)
    records = json.loads((stack_cfg.state_dir / "pids.json").read_text())
    assert set(records) == {"s3", "mlflow", "prefect", "ray"}
    status = stack_status(stack_cfg)
    assert all(s["running"] and s["healthy"] for s in status.values()), status
    env_sh = (stack_cfg.state_dir / "env.sh").read_text()
    assert f"export MLFLOW_TRACKING_URI={env['MLFLOW_TRACKING_URI']}" in env_sh
    assert env["AFM_STORE_URI"] == f"s3://{stack_cfg.bucket}/artifacts"

    script = stack_cfg.state_dir / "smoke_flow.py"
    script.write_text(FLOW_SCRIPT)
    client_env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "RAY_", "AWS_"))}
    proc = subprocess.run([sys.executable, str(script)], env={**client_env, **env}, cwd=Path(__file__).parents[2],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_id = proc.stdout.split("RUN_ID=")[1].split()[0]

    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    keys = [obj["Key"] for obj in s3.list_objects_v2(Bucket=stack_cfg.bucket, Prefix="mlflow/")["Contents"]]
    assert any(key.endswith(f"{run_id}/artifacts/rows.json") for key in keys), keys
    assert s3.get_object(Bucket=stack_cfg.bucket, Key="artifacts/smoke/ok.txt")["Body"].read() == b"ok"


    request = urllib.request.Request(f"{env['PREFECT_API_URL']}/flow_runs/filter", data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
    flow_runs = json.loads(urllib.request.urlopen(request, timeout=10).read())
    assert [run["state_type"] for run in flow_runs] == ["COMPLETED"]

    driver = subprocess.Popen([sys.executable, "-c", ATTACHED_DRIVER], env={**client_env, **env},
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert driver.stdout.readline().strip() == "up"
        started = time.monotonic()
        stopped = stack_down(stack_cfg)
        down_s = time.monotonic() - started
    finally:
        driver.kill()
        driver.wait()
    # Before RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0 the head waited for the driver's lease, then got SIGKILL.
    assert stopped == {"s3": "stopped", "mlflow": "stopped", "prefect": "stopped", "ray": "stopped"}
    assert down_s < stack_cfg.stop_timeout_s / 2, down_s
    assert all(group_members(record["pid"]) == [] for record in records.values())
    assert not (stack_cfg.state_dir / "pids.json").exists()
    assert stack_down(stack_cfg) == {}
    assert not any(s["running"] for s in stack_status(stack_cfg).values())

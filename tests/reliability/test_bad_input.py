"""Bad input everywhere, through the real CLI: malformed data, bad configs, missing paths, servers that are down.

Every case must exit non-zero within seconds with a message that names the file/line, the field, or the
endpoint and the env var that set it — no traceback — and leave no artifact directory without manifest.json.
Most cases run the typer app in-process (CliRunner, one import of the flows); one runs the installed console
script `.venv/bin/afm` as a subprocess to pin the real exit code and wall time.

    .venv/bin/pytest tests/reliability/test_bad_input.py -q
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.app import app
from models.format import Segment, Trajectory, write_jsonl
from models.tiny import TinyModelConfig, create_default_policy
from tests.reliability.conftest import base_env, closed_port, run_afm

ENDPOINT_VARS = ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "RAY_ADDRESS", "AFM_STORE_URI", "AWS_ENDPOINT_URL")
# A preflight failure must come back well before any library retry loop or Ray start-up would (~15 s+ here).
MAX_SECONDS = 15.0


def _invoke(args: list[str], home: Path, **env: str):
    """Run the CLI in-process with AFM_HOME=home and only the endpoint vars given; (result, seconds)."""
    full_env = {var: None for var in ENDPOINT_VARS}
    full_env.update(AFM_HOME=str(home), **env)
    started = time.perf_counter()
    result = CliRunner().invoke(app, args, env=full_env)
    return result, time.perf_counter() - started


def _half_written(store: Path) -> list[Path]:
    """Artifact directories (any dir holding files) under the store that lack manifest.json."""
    if not store.exists():
        return []
    return [d for d in store.rglob("*") if d.is_dir() and any(p.is_file() for p in d.iterdir())
            and not (d / "manifest.json").exists()]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> Path:
    return create_default_policy(tmp_path_factory.mktemp("policy") / "p", ["<think>hi</think> what is 1+1"] * 10,
                                 TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                                 intermediate_size=64), vocab_size=300)


@pytest.fixture()
def good_dataset(tmp_path) -> Path:
    path = tmp_path / "good.jsonl"
    write_jsonl(path, [Trajectory("t1", "q", "multihop", [Segment("answer", "a")], "a")])
    return path


def test_malformed_dataset_jsonl_names_file_and_line(afm_home, tmp_path, policy_dir, good_dataset):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good_dataset.read_text() + '{"id": "t2", "question": broken\n')
    result, seconds = _invoke(["sft", "--set", f"sft.model_path={policy_dir}", "--set", f"sft.dataset={bad}"], afm_home)
    assert result.exit_code == 1, result.output
    assert f"{bad}:2: not a trajectory record" in result.output and "Traceback" not in result.output
    assert seconds < MAX_SECONDS
    assert _half_written(afm_home / "artifacts") == []


def test_dataset_row_missing_a_field_names_line(afm_home, tmp_path, policy_dir, good_dataset):
    bad = tmp_path / "missing.jsonl"
    bad.write_text(good_dataset.read_text() + json.dumps({"id": "t2", "question": "q"}) + "\n")
    result, _ = _invoke(["sft", "--set", f"sft.model_path={policy_dir}", "--set", f"sft.dataset={bad}"], afm_home)
    assert result.exit_code == 1 and f"{bad}:2:" in result.output, result.output


@pytest.mark.parametrize("yaml_text, field, message", [
    ("sft:\n  lr: fast\n", "sft.lr", "valid number"),
    ("sft:\n  learning_rate: 0.1\n", "sft.learning_rate", "Extra inputs are not permitted"),
    ("sft: [1, 2]\n", "sft", "valid dictionary"),
])
def test_bad_config_exits_2_naming_file_and_field(afm_home, tmp_path, yaml_text, field, message):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml_text)
    result, seconds = _invoke(["sft", "--config", str(config)], afm_home)
    assert result.exit_code == 2, result.output
    assert str(config) in result.output and f"field '{field}'" in result.output and message in result.output
    assert seconds < MAX_SECONDS


def test_bad_override_and_unparsable_yaml_exit_2(afm_home, tmp_path):
    result, _ = _invoke(["pipeline", "--set", "rl.steps=many"], afm_home)
    assert result.exit_code == 2 and "field 'rl.steps'" in result.output, result.output
    broken = tmp_path / "broken.yaml"
    broken.write_text("sft: {lr: [\n")
    result, _ = _invoke(["sft", "--config", str(broken)], afm_home)
    assert result.exit_code == 2 and f"{broken}: not valid YAML" in result.output, result.output


def test_missing_model_path_is_named(afm_home, tmp_path, good_dataset):
    missing = tmp_path / "no-such-policy"
    result, seconds = _invoke(["sft", "--set", f"sft.model_path={missing}", "--set", f"sft.dataset={good_dataset}"],
                              afm_home)
    assert result.exit_code == 1 and f"field 'sft.model_path': '{missing}' does not exist" in result.output, result.output
    assert seconds < MAX_SECONDS
    result, _ = _invoke(["serve", str(missing), "--port", str(closed_port())], afm_home)
    assert result.exit_code == 1 and "field 'model'" in result.output, result.output
    result, _ = _invoke(["eval", "--set", f"eval.models.sft={missing}"], afm_home)
    assert result.exit_code == 1 and "field 'eval.models.sft'" in result.output, result.output


def test_cluster_recipe_on_a_machine_without_gpus_fails_fast(afm_home, monkeypatch):
    """`afm pipeline --config configs/qwen7b-cluster.yaml` here (no GPU, no Ray cluster): the GPU check of
    cli.preflight.check_cluster stops it before any stage starts, naming the fields to change."""
    monkeypatch.delenv("AFM_PREFLIGHT_SKIP_GPUS", raising=False)
    config = Path(__file__).resolve().parents[2] / "configs" / "qwen7b-cluster.yaml"
    result, seconds = _invoke(["pipeline", "--config", str(config)], afm_home)
    assert result.exit_code == 1, result.output
    assert "GPUs: the config asks for 8" in result.output and "rl.num_learners" in result.output
    assert "Traceback" not in result.output and seconds < MAX_SECONDS
    assert not (afm_home / "artifacts").exists()


@pytest.mark.parametrize("service, env", [
    ("MLflow", lambda port: {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"}),
    ("S3", lambda port: {"AFM_STORE_URI": "s3://afm/x", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}),
    ("Prefect", lambda port: {"PREFECT_API_URL": f"http://127.0.0.1:{port}/api"}),
    ("Ray", lambda port: {"RAY_ADDRESS": f"127.0.0.1:{port}"}),
])
def test_unreachable_server_fails_fast_and_clearly(afm_home, service, env):
    port = closed_port()
    result, seconds = _invoke(["distill", "--set", "distill.n_worlds=1"], afm_home, **env(port))
    assert result.exit_code == 1, result.output
    assert f"{service} at " in result.output and f"127.0.0.1:{port}" in result.output and "unreachable" in result.output
    assert "Traceback" not in result.output
    assert seconds < MAX_SECONDS
    assert not (afm_home / "artifacts").exists() and _half_written(afm_home / "artifacts") == []


@pytest.mark.slow  # a fresh interpreter imports prefect, mlflow, ray and torch (~10 s on 2 busy cores)
def test_console_script_exit_code_and_time_with_mlflow_down(afm_home):
    env = base_env(afm_home)
    env["MLFLOW_TRACKING_URI"] = f"http://127.0.0.1:{closed_port()}"
    code, output, seconds = run_afm(["pipeline", "--config", "configs/default.yaml"], env, timeout_s=120)
    assert code == 1 and "MLflow at" in output and "unreachable" in output, output
    assert "Traceback" not in output
    assert seconds < 60
    assert not (afm_home / "artifacts").exists()


def test_preflight_passes_reachable_endpoints_and_reads_every_address_form():
    """No false alarms: a listening port passes under every address form the platform's env vars use."""
    import socket

    from cli.preflight import check_endpoints, configured_endpoints

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        env = {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}", "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
               "RAY_ADDRESS": f"ray://127.0.0.1:{port}", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
        assert [s for s, _, _ in configured_endpoints("s3://afm/x", env)] == ["MLflow", "Prefect", "Ray", "S3"]
        assert check_endpoints("s3://afm/x", env) == []
        assert check_endpoints("", {**env, "RAY_ADDRESS": f"127.0.0.1:{port}"}) == []
    # Not probed: a local MLflow store, Ray started in-process, S3 unused by a local store.
    local = {"MLFLOW_TRACKING_URI": "sqlite:///x.db", "RAY_ADDRESS": "auto", "AWS_ENDPOINT_URL": "http://127.0.0.1:1"}
    assert configured_endpoints("/data/afm", local) == []


def test_pairs_dataset_is_not_checked_as_trajectories(afm_home, tmp_path):
    """`afm sft` on a when-to-act pairs file (`afm import-autocoa` writes one): preflight must not read it as
    trajectories. The missing policy makes preflight fail fast, so the output shows every complaint it had."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"id": "p", "question": "q", "prefix": "", "chosen": "a", "rejected": "b",
                                 "case": ""}) + "\n")
    result, _ = _invoke(["sft", "--set", f"sft.model_path={tmp_path / 'nope'}", "--set", f"sft.dataset={pairs}",
                         "--set", "sft.data_format=pairs", "--set", "sft.objective=pairwise"], afm_home)
    assert result.exit_code == 1 and "sft.model_path" in result.output, result.output
    assert str(pairs) not in result.output.replace(f"sft.dataset': {pairs!r}", "")

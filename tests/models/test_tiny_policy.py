"""Tiny model construction and policy save/load (local and from an artifact store)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from models.policy import load_policy, save_policy
from models.tiny import TinyModelConfig, build_tiny_model, create_default_policy
from models.tokenizer import encode_trajectory
from tests.models.conftest import corpus, sample_trajectory


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits


def test_build_is_seeded_and_sized(tokenizer, tiny_cfg):
    a, b = build_tiny_model(tiny_cfg, tokenizer), build_tiny_model(tiny_cfg, tokenizer)
    c = build_tiny_model(tiny_cfg.model_copy(update={"seed": 1}), tokenizer)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.model.layers[0].mlp.up_proj.weight, c.model.layers[0].mlp.up_proj.weight)
    assert a.config.vocab_size == len(tokenizer) and a.config.eos_token_id == tokenizer.eos_token_id
    default = build_tiny_model(TinyModelConfig(), tokenizer)
    assert 300_000 < sum(p.numel() for p in default.parameters()) < 5_000_000


def test_config_rejects_bad_heads_and_unknown_fields():
    with pytest.raises(ValidationError, match="must divide hidden_size"):
        TinyModelConfig(hidden_size=100, num_heads=3)
    with pytest.raises(ValidationError, match="num_kv_heads"):
        TinyModelConfig(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValidationError):
        TinyModelConfig(hidden=64)


def test_default_policy_save_load_gives_equal_logits(tmp_path, tiny_cfg):
    path = create_default_policy(tmp_path / "policy", corpus(), tiny_cfg, vocab_size=300)
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    model, tok = load_policy(path)
    assert model.config.vocab_size == len(tok) <= 300
    ids = encode_trajectory(tok, sample_trajectory(0)).input_ids
    fresh = build_tiny_model(tiny_cfg, tok)  # same seed -> same weights as the saved ones
    assert torch.equal(_logits(model, ids), _logits(fresh, ids))
    assert next(model.parameters()).dtype == torch.float32


def test_save_policy_replaces_atomically_and_leaves_no_temp(tmp_path, tiny_model, tokenizer):
    out = tmp_path / "p"
    save_policy(tiny_model, tokenizer, out)
    with torch.no_grad():
        tiny_model.lm_head.weight.add_(1.0)  # tied: changes the embedding too
    save_policy(tiny_model, tokenizer, out)
    reloaded, _ = load_policy(out)
    assert torch.equal(reloaded.lm_head.weight, tiny_model.lm_head.weight)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]


def test_load_policy_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope")):
        load_policy(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_policy(tmp_path / "empty")


@pytest.mark.integration
def test_load_policy_from_s3_artifact(tmp_path, tiny_model, tokenizer, monkeypatch):
    """A policy written as an artifact to S3 (moto's real HTTP server on 127.0.0.1) loads with equal logits."""
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    from afm.storage import open_store

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        for key, value in {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "test",
                           "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}.items():
            monkeypatch.setenv(key, value)
        boto3.client("s3").create_bucket(Bucket="afm-test")
        local = save_policy(tiny_model, tokenizer, tmp_path / "policy")
        files = {p.name: p for p in local.iterdir() if p.is_file()}
        open_store("s3://afm-test/artifacts").write_artifact("policies/tiny-v1", files, kind="policy")
        model, tok = load_policy("s3://afm-test/artifacts/policies/tiny-v1")
        ids = encode_trajectory(tok, sample_trajectory(0)).input_ids
        assert torch.equal(_logits(model, ids), _logits(tiny_model, ids))
    finally:
        server.stop()


def test_load_policy_turns_on_flush_denormal_for_every_thread(tmp_path, tiny_model, tokenizer):
    # A fresh process: the flag is process-wide, and other tests have loaded policies in this one already.
    save_policy(tiny_model, tokenizer, tmp_path / "policy")
    # The flag holds per thread, so the process starts as a worker does: load_policy before its first large op.
    script = f"""
import torch
from models.policy import load_policy
torch.set_num_threads(2)
small = torch.full((1000,), 1e-39)  # denormal in float32; too small to split, so it runs on this thread only
before = int((small * 1.0).count_nonzero())
load_policy({str(tmp_path / "policy")!r})
big = torch.full((1 << 20,), 1e-39)  # split over both threads of the pool this op creates
print(before, int((small * 1.0).count_nonzero()), int((big * 1.0).count_nonzero()),
      int((torch.full((1 << 20,), 1e-30) * 1.0).count_nonzero()))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    before, small_after, big_after, normal = map(int, out.stdout.split())
    assert (before, small_after, big_after, normal) == (1000, 0, 0, 1 << 20)

"""Artifact store on a local directory and on a real moto S3 server: primitives, manifests, verification."""
from __future__ import annotations

import json
import uuid

import pytest

from afm.storage import MANIFEST_NAME, ArtifactIntegrityError, LocalStore, S3Store, open_store


def _make_files(tmp_path):
    src = tmp_path / "src"
    (src / "ckpt").mkdir(parents=True)
    (src / "train.jsonl").write_text('{"id": 1}\n{"id": 2}\n{"id": 3}\n')
    (src / "ckpt" / "model.safetensors").write_bytes(bytes(range(256)) * 100)
    return {"train.jsonl": src / "train.jsonl", "ckpt/model.safetensors": src / "ckpt" / "model.safetensors"}


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(tmp_path / "store")
    client = request.getfixturevalue("s3_env")
    bucket = f"afm-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    return open_store(f"s3://{bucket}/artifacts")


def test_open_store_parses_uris(tmp_path):
    assert isinstance(open_store(tmp_path), LocalStore)
    assert open_store(f"file://{tmp_path}/x").root == (tmp_path / "x").resolve()
    s3 = open_store("s3://bucket/some/prefix/")
    assert isinstance(s3, S3Store) and s3.bucket == "bucket" and s3.prefix == "some/prefix"
    with pytest.raises(ValueError, match="not supported"):
        open_store("gs://bucket/x")


def test_primitives_roundtrip(store, tmp_path):
    store.put_bytes("a/b.txt", b"hello")
    assert store.get_bytes("a/b.txt") == b"hello"
    assert store.exists("a/b.txt") and not store.exists("a/missing")
    src = tmp_path / "f.bin"
    src.write_bytes(b"x" * 1000)
    store.put_file("a/c.bin", src)
    store.download_file("a/c.bin", tmp_path / "out" / "c.bin")
    assert (tmp_path / "out" / "c.bin").read_bytes() == b"x" * 1000
    assert store.list("a/") == ["a/b.txt", "a/c.bin"]
    store.delete("a/b.txt")
    assert store.list("a/") == ["a/c.bin"]


def test_write_read_fetch_artifact(store, tmp_path):
    files = _make_files(tmp_path)
    manifest = store.write_artifact("datasets/coa-v1", files, kind="dataset", extra={"seed": 3})
    assert manifest["kind"] == "dataset" and manifest["extra"] == {"seed": 3}
    assert manifest["files"]["train.jsonl"]["lines"] == 3
    assert manifest["files"]["ckpt/model.safetensors"]["size"] == 25600
    assert "lines" not in manifest["files"]["ckpt/model.safetensors"]
    assert store.read_manifest("datasets/coa-v1") == manifest
    out = store.fetch_artifact("datasets/coa-v1", tmp_path / "fetched")
    assert (out / "train.jsonl").read_text() == files["train.jsonl"].read_text()
    assert (out / "ckpt" / "model.safetensors").read_bytes() == files["ckpt/model.safetensors"].read_bytes()
    assert json.loads((out / MANIFEST_NAME).read_text())["digest"] == manifest["digest"]


def test_incomplete_artifact_has_no_manifest(store, tmp_path):
    """Files without a manifest (a writer that crashed before the last step) read as absent."""
    files = _make_files(tmp_path)
    store.put_file("datasets/partial/train.jsonl", files["train.jsonl"])
    assert store.read_manifest("datasets/partial") is None
    with pytest.raises(FileNotFoundError, match="incomplete"):
        store.fetch_artifact("datasets/partial", tmp_path / "x")


def test_manifest_written_last(tmp_path, monkeypatch):
    """A failure while uploading files leaves no manifest behind."""
    store = open_store(tmp_path / "store")
    files = _make_files(tmp_path)
    calls = []
    real_put_file = LocalStore.put_file

    def failing_put_file(self, key, path):
        calls.append(key)
        if len(calls) == 2:
            raise OSError("disk full")
        real_put_file(self, key, path)

    monkeypatch.setattr(LocalStore, "put_file", failing_put_file)
    with pytest.raises(OSError):
        store.write_artifact("ckpt/a", files, kind="checkpoint")
    assert store.read_manifest("ckpt/a") is None
    assert not list((tmp_path / "store").rglob("*.tmp"))


def test_fetch_detects_corruption(store, tmp_path):
    files = _make_files(tmp_path)
    store.write_artifact("datasets/v2", files, kind="dataset")
    store.put_bytes("datasets/v2/train.jsonl", b'{"id": 666}\n')
    with pytest.raises(ArtifactIntegrityError, match="sha256"):
        store.fetch_artifact("datasets/v2", tmp_path / "fetched")
    assert not (tmp_path / "fetched" / "train.jsonl").exists()


def test_local_store_refuses_escaping_keys(tmp_path):
    store = open_store(tmp_path / "store")
    with pytest.raises(ValueError, match="escapes"):
        store.put_bytes("../outside.txt", b"x")


class _Body:
    """The raw body botocore reads from an HTTP response (urllib3's `stream()` interface)."""

    def __init__(self, data: bytes):
        self.data = data

    def stream(self, **_):
        yield self.data


def test_s3_transient_error_is_retried(s3_env):
    """A 503 on the first PUT (injected before the request is sent) is retried and the write succeeds."""
    from botocore.awsrequest import AWSResponse

    s3_env.create_bucket(Bucket="afm-retry")
    store = open_store("s3://afm-retry/x")
    attempts = []

    def fail_first_put(request, **_):
        attempts.append(request.url)
        if len(attempts) == 1:
            return AWSResponse(request.url, 503, {}, _Body(b"<Error><Code>SlowDown</Code></Error>"))
        return None

    store.client.meta.events.register("before-send.s3.PutObject", fail_first_put)
    store.put_bytes("k.txt", b"v")
    assert len(attempts) == 2
    assert store.get_bytes("k.txt") == b"v"

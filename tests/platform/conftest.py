"""Fixtures for platform tests: a real moto S3 server on 127.0.0.1 (free port) and an isolated AFM_HOME."""
from __future__ import annotations

import socket

import boto3
import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint():
    """A ThreadedMotoServer for the whole session; tests use their own bucket names to stay independent."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_env(moto_endpoint, monkeypatch):
    """Point boto3 at the moto server with dummy credentials; returns a client for assertions."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")

"""Artifact store: one small interface over a local directory and S3, plus versioned, verified artifacts.

Usage:
    store = open_store("s3://afm/artifacts")          # or "/data/afm", "file:///data/afm"
    manifest = store.write_artifact("datasets/coa-v3", {"train.jsonl": Path("train.jsonl")}, kind="dataset",
                                    extra={"filters": ["format", "quality"]})
    store.read_manifest("datasets/coa-v3")           # None while incomplete (manifest is written last)
    local = store.fetch_artifact("datasets/coa-v3", Path("/tmp/coa-v3"))   # sha256-verified copy

S3: credentials come from the usual boto3 chain; `AWS_ENDPOINT_URL` points boto3 at MinIO/Ceph/moto.
Transient S3 errors are retried by botocore's "standard" retry mode (exponential backoff with jitter).

An artifact is a key prefix holding its files plus `manifest.json`. Files are uploaded first and the
manifest LAST, so a reader that sees a manifest sees a complete artifact; a crashed writer leaves files
without a manifest, which `read_manifest` reports as None. Local writes go to a temp file and are
`os.replace`d into place, so no half-written file is ever visible under its final name.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlparse

MANIFEST_NAME = "manifest.json"
# Read files in 8 MiB pieces so hashing a multi-GiB checkpoint shard does not load it into memory.
_CHUNK = 8 * 1024 * 1024


class ArtifactIntegrityError(RuntimeError):
    """A fetched file does not match the sha256 or size its manifest records."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def count_lines(path: Path) -> int:
    count = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            count += chunk.count(b"\n")
    return count


def describe_file(path: Path) -> dict:
    """Manifest entry for one file: sha256, size, and the line count for JSONL (one record per line)."""
    entry: dict = {"sha256": sha256_file(path), "size": path.stat().st_size}
    if path.suffix == ".jsonl":
        entry["lines"] = count_lines(path)
    return entry


def manifest_digest(manifest: dict) -> str:
    """One sha256 over the manifest's files (names + per-file sha256): the artifact's content identity."""
    listing = json.dumps({name: meta["sha256"] for name, meta in sorted(manifest["files"].items())})
    return hashlib.sha256(listing.encode()).hexdigest()


class ArtifactStore(ABC):
    """Shared artifact logic (manifests, verification) on top of a backend's key/value primitives.

    Keys are '/'-separated and relative to the store's root (a directory or an S3 prefix).
    """

    uri: str

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def get_bytes(self, key: str) -> bytes: ...

    @abstractmethod
    def put_file(self, key: str, path: Path) -> None: ...

    @abstractmethod
    def download_file(self, key: str, path: Path) -> None: ...

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]: ...

    @abstractmethod
    def delete(self, key: str) -> None: ...

    def write_artifact(self, name: str, files: dict[str, Path], kind: str, extra: dict | None = None) -> dict:
        """Upload `files` (artifact-relative name -> local path) under `name`, then its manifest; return it."""
        return self.write_manifest(name, self.upload_files(name, files), kind, extra)

    def upload_files(self, name: str, files: dict[str, Path]) -> dict[str, dict]:
        """Upload `files` under `name` without a manifest (the artifact stays incomplete); return their manifest
        entries for `write_manifest`. For a writer that must reference the files before the artifact is done
        (a model registered while its stage is still running)."""
        entries = {}
        for rel_name, path in files.items():
            path = Path(path)
            if not path.is_file():
                raise FileNotFoundError(f"write_artifact({name!r}): file for {rel_name!r} not found: {path}")
            if rel_name == MANIFEST_NAME:
                raise ValueError(f"write_artifact({name!r}): {MANIFEST_NAME!r} is reserved for the manifest")
            entries[rel_name] = describe_file(path)
            self.put_file(f"{name}/{rel_name}", path)
        return entries

    def write_manifest(self, name: str, entries: dict[str, dict], kind: str, extra: dict | None = None) -> dict:
        """Complete the artifact `name` whose files `upload_files` stored: write its manifest last; return it."""
        manifest = {
            "name": name,
            "uri": self.artifact_uri(name),
            "kind": kind,
            "created_at": datetime.now(timezone.utc).isoformat(),
            "files": entries,
            "extra": extra or {},
        }
        manifest["digest"] = manifest_digest(manifest)
        self.put_bytes(f"{name}/{MANIFEST_NAME}", json.dumps(manifest, indent=2, sort_keys=True).encode())
        return manifest

    def artifact_uri(self, name: str) -> str:
        return f"{self.uri}/{name}"

    def read_manifest(self, name: str) -> dict | None:
        """The artifact's manifest, or None when the artifact is absent or incomplete (no manifest yet)."""
        key = f"{name}/{MANIFEST_NAME}"
        if not self.exists(key):
            return None
        return json.loads(self.get_bytes(key))

    def fetch_artifact(self, name: str, local_dir: Path) -> Path:
        """Download a complete artifact into `local_dir`, verifying every file's size and sha256."""
        manifest = self.read_manifest(name)
        if manifest is None:
            raise FileNotFoundError(f"{self.uri}: artifact {name!r} has no {MANIFEST_NAME} (absent or incomplete)")
        local_dir = Path(local_dir)
        for rel_name, meta in manifest["files"].items():
            target = local_dir / rel_name
            target.parent.mkdir(parents=True, exist_ok=True)
            self.download_file(f"{name}/{rel_name}", target)
            actual = sha256_file(target)
            if actual != meta["sha256"] or target.stat().st_size != meta["size"]:
                target.unlink()
                raise ArtifactIntegrityError(
                    f"{self.uri}/{name}/{rel_name}: sha256 {actual} != manifest {meta['sha256']}; "
                    "the stored file is corrupt or was overwritten — rewrite the artifact under a new name"
                )
        (local_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        return local_dir


class LocalStore(ArtifactStore):
    """Store rooted at a local directory; every write is temp file + os.replace (atomic on one filesystem)."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.uri = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root):
            raise ValueError(f"{self.uri}: key {key!r} escapes the store root")
        return path

    def _atomic_write(self, target: Path, write) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                write(handle)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def put_bytes(self, key: str, data: bytes) -> None:
        self._atomic_write(self._path(key), lambda handle: handle.write(data))

    def get_bytes(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def put_file(self, key: str, path: Path) -> None:
        def copy(handle):
            with open(path, "rb") as source:
                shutil.copyfileobj(source, handle, _CHUNK)

        self._atomic_write(self._path(key), copy)

    def download_file(self, key: str, path: Path) -> None:
        source = self._path(key)
        if not source.is_file():
            raise FileNotFoundError(f"{self.uri}: no object {key!r}")
        target = Path(path)

        def copy(handle):
            with open(source, "rb") as src:
                shutil.copyfileobj(src, handle, _CHUNK)

        self._atomic_write(target, copy)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        """All keys starting with `prefix` (string prefix, like S3), sorted; temp files are skipped."""
        keys = []
        for path in self.root.rglob("*"):
            if path.is_file() and not (path.name.startswith(".") and path.name.endswith(".tmp")):
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


class S3Store(ArtifactStore):
    """Store rooted at `s3://bucket/prefix`. S3 PUTs are atomic per object, so no temp keys are needed."""

    def __init__(self, bucket: str, prefix: str = ""):
        import boto3
        from botocore.config import Config as BotoConfig

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        # "standard" mode retries throttling, 5xx and connection errors with exponential backoff + jitter.
        # boto3 reads AWS_ENDPOINT_URL itself; passing it explicitly keeps the override visible here.
        self.client = boto3.client(
            "s3",
            endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None,
            config=BotoConfig(retries={"max_attempts": 8, "mode": "standard"}),
        )

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_bytes(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def get_bytes(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()

    def put_file(self, key: str, path: Path) -> None:
        # upload_file switches to multipart for large files; S3 shows the object only once it completes.
        self.client.upload_file(str(path), self.bucket, self._key(key))

    def download_file(self, key: str, path: Path) -> None:
        # boto3 downloads into a temp name and renames, so `path` never holds a partial file.
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.client.download_file(self.bucket, self._key(key), str(path))

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as exc:
            if exc.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def list(self, prefix: str = "") -> list[str]:
        keys = []
        strip = len(self.prefix) + 1 if self.prefix else 0
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
            keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
        return sorted(keys)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))


def directory_files(root: Path) -> dict[str, Path]:
    """Every file under `root` as {relative posix name: path}, for `write_artifact` of a model directory."""
    return {p.relative_to(root).as_posix(): p for p in sorted(Path(root).rglob("*")) if p.is_file()}


def file_identity(path: Path) -> tuple[str, str]:
    """(URI, sha256) of a data file for lineage: the store URI when the file came from a fetched artifact
    (`fetch_artifact` leaves the artifact's manifest beside its files), else its absolute path."""
    path = Path(path).resolve()
    manifest_path = path.parent / MANIFEST_NAME
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        entry = manifest.get("files", {}).get(path.name)
        if entry is not None:
            return f"{manifest['uri']}/{path.name}", entry["sha256"]
    return str(path), sha256_file(path)


def local_path(uri: str | Path) -> Path:
    """The filesystem path of a local URI (`file:///abs` or a plain path); artifacts of a LocalStore have
    `file://` URIs and are usable in place."""
    text = str(uri)
    return Path(urlparse(text).path if text.startswith("file://") else text).expanduser()


def open_store(uri: str | Path) -> ArtifactStore:
    """A store for a local path, `file:///abs/path` or `s3://bucket/prefix`."""
    text = str(uri)
    parsed = urlparse(text)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"store URI {text!r}: expected s3://bucket/prefix")
        return S3Store(parsed.netloc, parsed.path)
    if parsed.scheme == "file":
        return LocalStore(Path(parsed.path))
    if parsed.scheme == "":
        return LocalStore(Path(text))
    raise ValueError(f"store URI {text!r}: scheme {parsed.scheme!r} not supported; use a path, file:// or s3://")

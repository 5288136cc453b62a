"""The two install targets stay inside pyproject.toml's ranges (issue #22): the GPU worker image's lock
(infra/requirements-gpu.lock, `pip install .[gpu]` resolved by infra/gpu-lock.sh for Linux x86_64 CUDA) and the
CPU constraints of `make setup` (infra/cpu-constraints.txt). Offline: it reads the files, it resolves nothing,
so a pyproject.toml edit that the lock no longer satisfies fails here until `bash infra/gpu-lock.sh` is rerun.
    .venv/bin/python -m pytest -q tests/core/test_gpu_extra.py"""
from __future__ import annotations

import importlib.util
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "infra" / "requirements-gpu.lock"
CPU_CONSTRAINTS = ROOT / "infra" / "cpu-constraints.txt"


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pins(path: Path) -> dict[str, Version]:
    """`name==version` lines of a requirements file (comments and uv's `# via` lines skipped)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"{path.name}: {line!r} is not an exact pin"
            out[canonicalize_name(req.name)] = Version(spec.version)
    return out


def test_gpu_lock_satisfies_every_requirement_of_the_gpu_extra():
    meta = project()
    lock = pins(LOCK)
    reqs = [Requirement(r) for r in meta["dependencies"] + meta["optional-dependencies"]["gpu"]]
    unmet = [f"{r} (lock: {lock.get(canonicalize_name(r.name))})" for r in reqs
             if canonicalize_name(r.name) not in lock or not r.specifier.contains(lock[canonicalize_name(r.name)])]
    assert not unmet, f"re-run `bash infra/gpu-lock.sh`: the lock misses {unmet}"
    assert "vllm" in lock and lock["torch"] >= Version("2.14"), "the lock is the vLLM image's set"


def test_gpu_lock_is_the_plain_resolution():
    """Made by infra/gpu-lock.sh with no overrides, for one platform (no environment markers left to decide
    at install time)."""
    text = LOCK.read_text()
    assert "bash infra/gpu-lock.sh" in text.splitlines()[1]
    assert "--override" not in text and " ; " not in text
    assert not (ROOT / "infra" / "gpu-overrides.txt").exists()


def test_cpu_constraints_sit_inside_the_ranges():
    constraints = pins(CPU_CONSTRAINTS)
    assert constraints["torch"] == Version("2.13.0"), "the CPU default stays on the tested torch 2.13 CPU wheel"
    reqs = {canonicalize_name(Requirement(r).name): Requirement(r) for r in project()["dependencies"]}
    for name, pinned in constraints.items():
        assert reqs[name].specifier.contains(pinned), f"{name}=={pinned} is outside pyproject's {reqs[name]}"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="the GPU image installs the GPU lock")
def test_this_venv_follows_the_cpu_constraints():
    """The venv `make setup` built; a local label (+cpu) is not part of the pin."""
    for name, pinned in pins(CPU_CONSTRAINTS).items():
        assert Version(version(name)).public == str(pinned), f"{name} {version(name)} installed, {pinned} pinned"

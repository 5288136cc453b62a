"""Imports point down (#25): cli -> flows -> tasks -> domain packages -> the platform core `afm`. Read from the
source (every import statement, also those inside functions), so a lazy import that climbs a layer fails too."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = {"models", "agents", "problems", "training", "evaluation", "distill", "serving"}
# Which first-party packages each layer may import (besides itself).
ALLOWED = {
    "afm": set(),
    **{package: DOMAIN | {"afm"} for package in DOMAIN},
    "tasks": DOMAIN | {"afm"},
    "flows": DOMAIN | {"afm", "tasks"},
    "cli": DOMAIN | {"afm", "tasks", "flows"},
}


def imported_packages(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & set(ALLOWED)


def test_imports_point_down():
    climbing = []
    for package, allowed in ALLOWED.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in sorted(imported_packages(path) - allowed - {package}):
                climbing.append(f"{path.relative_to(ROOT)} imports {name}")
    assert climbing == []

"""ToolBox: dispatch, unknown tags, on-disk cache keyed by content hash, describe(), build_toolbox from config."""
from __future__ import annotations

import json

import pytest

from agents.tools.base import ToolResult, truncate_middle
from agents.tools.toolbox import ToolBox, ToolboxConfig, build_toolbox


class CountingTool:
    """A real (trivial) tool that counts how often it actually ran."""

    name = "web_search"
    description = "web_search: counts calls"

    def __init__(self, status: str = "ok"):
        self.calls = 0
        self.status = status

    def run(self, argument: str) -> ToolResult:
        self.calls += 1
        return ToolResult(f"ran {argument} #{self.calls}", self.status)


def test_unknown_tag_names_available_tools():
    box = ToolBox({"web_search": CountingTool()}, cache_dir=None)
    result = box.call("browse", "x")
    assert result.status == "error" and "browse" in result.text and "web_search" in result.text


def test_cache_hits_skip_the_tool_and_survive_a_new_toolbox(tmp_path):
    tool = CountingTool()
    box = ToolBox({"web_search": tool}, cache_dir=tmp_path, config_fingerprint="cfg-a")
    first = box.call("web_search", "q")
    assert box.call("web_search", "q") == first and tool.calls == 1
    again = ToolBox({"web_search": tool}, cache_dir=tmp_path, config_fingerprint="cfg-a")
    assert again.call("web_search", "q") == first and tool.calls == 1
    other_config = ToolBox({"web_search": tool}, cache_dir=tmp_path, config_fingerprint="cfg-b")
    other_config.call("web_search", "q")
    assert tool.calls == 2
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 2 and all(len(name) == 64 + 5 for name in files)  # sha256 hex + ".json", no temp left
    record = json.loads((tmp_path / files[0]).read_text())
    assert record["tag"] == "web_search" and record["argument"] == "q"


def test_timeouts_are_not_cached(tmp_path):
    tool = CountingTool(status="timeout")
    box = ToolBox({"web_search": tool}, cache_dir=tmp_path)
    box.call("web_search", "q")
    box.call("web_search", "q")
    assert tool.calls == 2


class RaisingTool:
    name = "code"
    description = "code: always raises"

    def run(self, argument: str) -> ToolResult:
        raise RuntimeError("backend exploded")


def test_a_raising_tool_becomes_an_error_result_and_is_not_cached(tmp_path):
    box = ToolBox({"code": RaisingTool()}, cache_dir=tmp_path)
    result = box.call("code", "x")
    assert result.status == "error" and "RuntimeError: backend exploded" in result.text
    assert not list(tmp_path.iterdir())


def test_tool_name_must_match_its_tag():
    with pytest.raises(ValueError, match="must match"):
        ToolBox({"code": CountingTool()}, cache_dir=None)


def test_truncate_middle_keeps_head_and_tail():
    text = "HEAD" + "x" * 10_000 + "TAIL"
    cut = truncate_middle(text, 200)
    assert len(cut) <= 200 and cut.startswith("HEAD") and cut.endswith("TAIL") and "truncated" in cut


def test_build_toolbox_from_config(corpus_path, tmp_path):
    cfg = ToolboxConfig(tools=["web_search", "wiki_search", "crawl_page", "code"], corpus_path=corpus_path,
                        cache_dir=tmp_path / "cache", code_timeout_s=5)
    box = build_toolbox(cfg)
    assert set(box.tools) == {"web_search", "wiki_search", "crawl_page", "code"}
    described = box.describe()
    for tag in box.tools:
        assert f"- {tag}:" in described
    assert "1. [Kato Rimu]" in box.call("wiki_search", "Kato Rimu born").text
    code = box.call("code", "```python\nprint(6 * 7)\n```")
    assert code.status == "ok" and "42" in code.text
    assert box.call("crawl_page", "http://evil.example/").status == "refused"


def test_build_toolbox_requires_a_corpus_for_local_search():
    with pytest.raises(ValueError, match="corpus_path"):
        build_toolbox(ToolboxConfig(tools=["web_search"]))

"""Tools shared by the teacher MAS, RL rollouts and evaluation, addressed by their CoA tag.

    from agents.tools.toolbox import ToolboxConfig, build_toolbox
    toolbox = build_toolbox(ToolboxConfig(corpus_path=Path("corpus.jsonl"),
                                          crawl_resolve={"miniweb.local": "127.0.0.1:8123"}))
    result = toolbox.call("web_search", "Kato Rimu")   # ToolResult(text, status); never raises

Modules: base (ToolResult, Tool protocol), toolbox (ToolBox, ToolboxConfig, build_toolbox), search (BM25Search,
SerperSearch, SearxngSearch), crawl (CrawlPage) + ssrf (check_url), code (CodeTool) + sandbox (run_python,
SandboxLimits). Figures for the sandbox and SSRF guard: docs/reliability.md.
"""

"""The teacher multi-agent system whose logs are distilled into Chain-of-Agents trajectories.

Modules: `mas` (TeacherConfig, run_mas: the coordinator loop), `agents` (role and tool agents), `protocol`
(reply schemas, tolerant reply parser),
`backends` (LLMBackend interface, OpenAIChatBackend, LocalEngineBackend, token estimate), `oracle`
(ScriptedOracleBackend for generated families), `log` (MASLog JSONL), `answers` (answer normalization).
"""

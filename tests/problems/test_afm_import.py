"""AFM release import: both row layouts become valid Trajectories that round-trip; bad rows are reported."""
import json

from models.format import read_jsonl, render_segments, write_jsonl
from problems.afm_import import import_afm_trajectories

SYSTEM = "You are a helpful assistant. Use <think>, <plan>, <web_search>, <crawl_page> ... and end with <answer>."
INLINE = (
    "<think>I need the director of The Lumo Road, then where they were born.</think>"
    "<plan>1. search the film 2. search the director</plan>"
    "<web_search>The Lumo Road</web_search>"
    "<observation>Found 1 results:\n\n1. [The Lumo Road](http://miniweb.local/wiki/The_Lumo_Road)\n"
    "The Lumo Road was directed by Kato Rimu.</observation>\n"
    "<reflection>Tool effectiveness: good. The director is Kato Rimu.</reflection>"
    "<web_search>Kato Rimu</web_search>\n<observation>\nKato Rimu was born in Velo.\n</observation>\n\n"
    "<suggested_answer>Velo</suggested_answer><double_check>Score 4: both facts come from the pages.</double_check>"
    "<answer>Velo</answer>"
)
SAMPLE = [
    # one assistant message, inline observations (the SFT layout)
    {"id": "web-0001", "data_source": "hotpotqa", "conversations": [
        {"from": "system", "value": SYSTEM},
        {"from": "human", "value": "Where was the director of The Lumo Road born?"},
        {"from": "gpt", "value": INLINE}]},
    # multi-turn with separate tool messages (OpenAI messages layout)
    {"messages": [
        {"role": "user", "content": "What is 2**20?"},
        {"role": "assistant", "content": "<plan>Compute it.</plan><code>```python\nprint(2**20)\n```</code>"},
        {"role": "tool", "content": "[RESULT:SUCCESS]\n1048576"},
        {"role": "assistant", "content": "<think>The code printed 1048576.</think><answer>\\boxed{1048576}</answer>"}]},
    # bad: tool call without an observation
    {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "<web_search>x</web_search><answer>a</answer>"}]},
    # bad: unclosed tag
    {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "<think>oops <answer>a</answer>"}]},
    # bad: no conversation at all
    {"question": "q", "answer": ["a"]},
]


def test_import_round_trip_and_errors(tmp_path):
    src = tmp_path / "afm_sft.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in SAMPLE) + "{broken\n")
    report = import_afm_trajectories(src, family="afm_web")
    assert len(report.trajectories) == 2
    web, code = report.trajectories
    assert web.id == "web-0001" and web.answer == "Velo" and web.question.startswith("Where was the director")
    assert [s.tag for s in web.segments] == [
        "think", "plan", "web_search", "observation", "reflection", "web_search", "observation",
        "suggested_answer", "double_check", "answer"]
    assert web.segments[6].text == "Kato Rimu was born in Velo."
    assert web.metadata["system_prompt"] == SYSTEM and web.metadata["data_source"] == "hotpotqa"
    assert code.id == "afm_sft-2" and code.answer == "\\boxed{1048576}" and code.tool_calls == 1
    assert code.segments[2].tag == "observation" and code.segments[2].text == "[RESULT:SUCCESS]\n1048576"

    assert [e.split(": ", 1)[0] for e in report.errors] == [f"{src}:{n}" for n in (3, 4, 5, 6)]
    assert "has no observation" in report.errors[0] or "may not follow" in report.errors[0]
    assert "text outside any segment" in report.errors[1]
    assert "no 'conversations'" in report.errors[2]
    assert "not valid JSON" in report.errors[3]

    out = tmp_path / "trajectories.jsonl"
    write_jsonl(out, report.trajectories)
    back = list(read_jsonl(out))
    assert [t.to_dict() for t in back] == [t.to_dict() for t in report.trajectories]
    assert "<observation>\nKato Rimu was born in Velo.\n</observation>" in render_segments(back[0].segments)

"""ShareGPT loading: a cut-off JSON array still yields its complete records; the split is stable."""

import json

from blockdraft.data import load_conversations, split_conversations, user_prompts


def test_truncated_array_yields_complete_records(tmp_path):
    records = [{"id": str(i), "conversations": [{"from": "human", "value": f"question number {i}?" * 3}]}
               for i in range(5)]
    text = json.dumps(records, indent=1)
    cut = text[: text.index('"id": "4"') + 12]  # cut in the middle of the last record
    path = tmp_path / "sharegpt.json"
    path.write_text(cut)
    loaded = load_conversations(str(path))
    assert [r["id"] for r in loaded] == ["0", "1", "2", "3"]
    assert len(user_prompts(loaded)) == 4


def test_split_is_deterministic_and_disjoint():
    records = [{"id": f"c{i}", "conversations": [{}]} for i in range(2000)]
    train, valid = split_conversations(records, valid_share=0.05)
    train2, valid2 = split_conversations(records, valid_share=0.05)
    assert valid == valid2 and len(train) + len(valid) == 2000
    assert 50 <= len(valid) <= 150
    assert not {r["id"] for r in train} & {r["id"] for r in valid}


def test_jsonl_skips_a_torn_line_but_not_what_follows(tmp_path):
    lines = [json.dumps({"id": str(i), "conversations": [{"from": "human", "value": "q"}]}) for i in range(3)]
    path = tmp_path / "self.jsonl"
    path.write_text(lines[0] + "\n" + lines[1][:20] + "\n" + lines[2] + "\n")  # line 2 torn by a killed run
    assert [r["id"] for r in load_conversations(str(path))] == ["0", "2"]
    path.write_text(path.read_text() + lines[1] + "\n")  # the file grew: read again, not from the cache
    assert [r["id"] for r in load_conversations(str(path))] == ["0", "2", "1"]

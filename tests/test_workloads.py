"""Workloads as data: dataset files read and drawn with a seed, and shared-prefix prompts.

The two fixtures in ``fixtures/datasets`` hold the same small conversations, as ShareGPT's JSON
list (``sharegpt.json``: 14 entries, 11 usable) and as OpenAI's messages, one a line
(``chats.jsonl``: 10 entries, 8 usable, a blank line among them); each holds entries the
reader must leave out (a conversation that starts with the reply, an empty one, one with a
tool's message). Lengths are counted in words here (``Lengths.words``) or by a stand-in
tokenizer; the server's own tokenizer is used in ``test_sessions``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bisect_harness.errors import DatasetError, UserError
from bisect_harness.measure.datasets import Lengths, draw, read_dataset
from bisect_harness.measure.workloads import shared_prefix_prompts, workload_jobs
from bisect_harness.measure.jobs import RequestJob
from bisect_harness.measure.sessions import SessionJob
from bisect_harness.model import BenchmarkSpec
from bisect_harness.workload import Dataset, MultiTurn, SharedPrefix

FIXTURES = Path(__file__).parent / "fixtures" / "datasets"
SHAREGPT = str(FIXTURES / "sharegpt.json")
CHATS = str(FIXTURES / "chats.jsonl")
WORDS = Lengths.words()


def words(text: str) -> int:
    return len(text.split())


# --------------------------------------------------------------------------- reading


def test_sharegpt_json_and_openai_jsonl_read_as_the_same_conversations():
    share, chats = read_dataset(SHAREGPT), read_dataset(CHATS)
    assert (share.entries, len(share.conversations)) == (14, 11)
    assert (chats.entries, len(chats.conversations)) == (10, 8)
    # entries are named where the file holds them: an index in a JSON list, a line in JSONL
    assert share.conversations[0].where == "index 0" and chats.conversations[0].where == "line 1"
    assert [c.where for c in chats.conversations][4:] == ["line 7", "line 9", "line 10", "line 11"]  # line 6 blank
    # the same text either way, content parts joined; ShareGPT's roles read as the chat API's
    by_first = {c.turns[0][0]: c for c in share.conversations}
    for c in chats.conversations:
        assert by_first[c.turns[0][0]].turns == c.turns and by_first[c.turns[0][0]].system == c.system
    bread = next(c for c in share.conversations if c.turns[0][0].startswith("Give me a recipe"))
    assert len(bread.turns) == 1 and bread.turns[0][1].startswith("Mix flour")
    rivers = next(c for c in share.conversations if c.turns[0][0].startswith("List three uses"))
    assert [u for u, _ in rivers.turns] == ["List three uses of a river for a small town.",
                                            "Which of these is the oldest?", "And which matters most today?"]
    system = next(c for c in share.conversations if c.system is not None)
    assert system.system == "You answer in one sentence." and system.turns[0][0] == "Why do cities grow near water?"
    # what was left out, counted, with where the first such was
    assert {why: (n, where) for why, n, where in share.left_out} == {
        "without a user turn followed by a reply": (2, "index 4"),
        "with a role other than user, assistant or system ('tool')": (1, "index 11"),
    }
    assert "11 usable conversations of 14 entries" in share.describe()


def test_a_file_is_read_once_while_it_is_unchanged(tmp_path):
    path = tmp_path / "d.json"
    shutil.copy(SHAREGPT, path)
    first = read_dataset(str(path))
    assert read_dataset(str(path)) is first
    data = json.loads(path.read_text())
    path.write_text(json.dumps(data[:3]))
    later = path.stat().st_mtime_ns + 10**9  # a second on: a new stamp even where the clock is coarse
    os.utime(path, ns=(later, later))
    again = read_dataset(str(path))
    assert again is not first and again.entries == 3


@pytest.mark.parametrize("name, text, says", [
    ("bad.json", '[{"conversations": []},\n {"conversations": [}]', ["bad.json is not valid JSON", "line 2 column"]),
    ("bad.jsonl", '{"messages": []}\n{"messages": []}\n{"messages": [\n', ["bad.jsonl line 3 is not a JSON object"]),
    ("obj.json", '{"conversations": [{"from": "human", "value": "a"}]}\n  {"x": 1}\n',
     ["obj.json line 2: the entry has neither 'conversations' nor 'messages'"]),
    ("scalar.json", '[{"conversations": []}, 7]', ["scalar.json index 1: the entry is int, not an object"]),
    ("text.json", '[{"conversations": [{"from": "human", "value": 3}]}]',
     ["text.json index 0: conversations[0]'s text is int, not a string"]),
    ("role.jsonl", '{"messages": [{"content": "hi"}]}', ["role.jsonl line 1: messages[0] has no role"]),
    ("keys.jsonl", '{"a": 1}', ["keys.jsonl line 1: the entry has neither 'conversations' nor 'messages' "
                                "(its keys: a)"]),
    ("nothing.json", ' [\n] ', ["has no usable conversation", "nothing.json: 0 usable conversations of 0 entries"]),
    ("empty.json", "  \n", ["empty.json is empty"]),
    ("text.txt", "hello", ["text.txt starts with 'h': it is neither a JSON list"]),
    ("none.json", '[{"conversations": [{"from": "gpt", "value": "x"}]}, {"messages": []}]',
     ["has no usable conversation", "2 without a user turn followed by a reply (first at index 0)",
      "A usable one starts (after any system messages) with a user turn followed by a reply"]),
])
def test_a_malformed_file_or_one_with_nothing_usable_is_an_error_that_names_where(tmp_path, name, text, says):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DatasetError) as e:
        read_dataset(str(path))
    message = str(e.value)
    assert isinstance(e.value, UserError) and str(path) in message
    for part in says:
        assert part in message, message
    if "usable" not in says[0]:  # every malformed file is told what a usable entry looks like
        assert "a usable entry is ShareGPT's" in message, message


def test_a_missing_file_is_an_error_that_says_where_to_look(tmp_path):
    with pytest.raises(DatasetError, match="cannot read dataset .*nope.json: No such file.*benchmark.workload"):
        read_dataset(str(tmp_path / "nope.json"))


def test_a_file_that_is_not_utf8_is_an_error(tmp_path):
    path = tmp_path / "latin.json"
    path.write_bytes('[{"conversations": [{"from": "human", "value": "caf\u00e9"}]}]'.encode("latin-1"))
    with pytest.raises(DatasetError, match="is not UTF-8 text"):
        read_dataset(str(path))


# --------------------------------------------------------------------------- drawing


def test_first_turn_draws_are_fixed_by_seed_boot_and_sample():
    ds = Dataset(SHAREGPT)

    def picks(seed=0, boot=1, sample=1, lengths=WORDS):
        return [d.where for d in draw(ds, 4, lengths, seed=seed, boot=boot, sample=sample)]

    # both arms of a round ask with the same numbers: the same conversations, whoever counts
    # (another server with the same tokenizer; here the same count by another function)
    assert picks() == picks() == picks(lengths=Lengths(lambda t: len(t.split()), "tokens", "POST /tokenize"))
    assert len(set(picks())) == 4  # never one conversation twice in a sample
    # the samples of a boot take conversations of their own while the file lasts (ten of its
    # eleven have four words or more), then come round again; boots and seeds draw apart
    queue = [d.where for d in draw(ds, 10, WORDS, seed=0, boot=1, sample=1)]
    assert picks(sample=1) == queue[:4] and picks(sample=2) == queue[4:8]
    assert picks(sample=3) == queue[8:] + queue[:2]
    assert picks(sample=0) == queue[::-1][:4]  # the warm-up: from the far end
    assert picks(boot=2) != picks(boot=1) and picks(seed=5) != picks(seed=0)
    # first_turn: the prompt is the first user turn, the output the reply's length, no system prompt
    (d,) = [d for d in draw(ds, 10, WORDS, seed=0, boot=1, sample=1) if d.where == "index 7"]
    reply = "Water brings trade, food and travel, so people settle where it is."
    assert d.system is None and d.turns == (("Why do cities grow near water?", words(reply)),)


def test_length_filters_keep_the_conversations_within_them():
    ds = Dataset(SHAREGPT, min_prompt_tokens=6, max_prompt_tokens=12, max_output_tokens=20)
    drawn = draw(ds, 3, WORDS, seed=0, boot=1, sample=1)
    assert len(drawn) == 3
    for d in drawn:
        (prompt, out), = d.turns
        assert 6 <= words(prompt) <= 12 and 1 <= out <= 20, d
    # only five pass; a sample of six cannot be drawn without repeating one: an error that says why
    ok = [c for c in read_dataset(SHAREGPT).conversations
          if 6 <= words(c.turns[0][0]) <= 12 and words(c.turns[0][1]) <= 20]
    assert len(ok) == 5
    assert len(draw(ds, 5, WORDS, seed=0, boot=1, sample=1)) == 5
    with pytest.raises(DatasetError) as e:
        draw(ds, 6, WORDS, seed=0, boot=1, sample=1)
    message = str(e.value)
    assert "a sample needs 6 requests in mode first_turn" in message and "give 5 that pass the filters" in message
    assert "min_prompt_tokens=6, max_prompt_tokens=12, max_output_tokens=20; lengths in words" in message
    assert "with a prompt under min_prompt_tokens (first at index" in message
    assert "Use a larger dataset, wider filters or fewer requests a sample" in message


def test_lengths_in_tokens_come_from_the_counter_and_short_texts_are_not_sent_to_it():
    asked = []

    def count(text):  # a tokenizer of two tokens a word
        asked.append(text)
        return 2 * len(text.split())

    ds = Dataset(SHAREGPT, min_prompt_tokens=20, max_output_tokens=200)
    drawn = draw(ds, 2, Lengths(count, "tokens", "POST /tokenize (content)"), seed=0, boot=1, sample=1)
    for d in drawn:
        (prompt, out), = d.turns
        assert 2 * words(prompt) >= 20 and out == 2 * words(next(c.turns[0][1] for c in read_dataset(SHAREGPT)
                                                                   .conversations if c.turns[0][0] == prompt))
    assert "hi" not in asked  # two bytes cannot be 20 tokens: not counted at all


def test_conversation_draws_whole_sessions_and_filter_on_their_longest_prompt():
    ds = Dataset(SHAREGPT, mode="conversation", max_prompt_tokens=60)
    drawn = draw(ds, 7, WORDS, seed=3, boot=1, sample=1)
    assert sum(len(d.turns) for d in drawn) >= 7 > sum(len(d.turns) for d in drawn[:-1])
    by_where = {c.where: c for c in read_dataset(SHAREGPT).conversations}
    for d in drawn:
        conv = by_where[d.where]
        assert d.system == conv.system and [u for u, _ in d.turns] == [u for u, _ in conv.turns]
        assert [n for _, n in d.turns] == [words(r) for _, r in conv.turns]
        longest = sum(words(t) for t in ([conv.system] if conv.system else []) +
                      [t for u, r in conv.turns for t in (u, r)][:-1])
        assert longest <= 60
    multi = draw(Dataset(SHAREGPT, mode="conversation"), 14, WORDS, seed=0, boot=1, sample=1)
    assert len(multi) == 10 and any(d.system for d in multi) and max(len(d.turns) for d in multi) == 3


def test_an_unknown_mode_is_refused():
    with pytest.raises(DatasetError, match="dataset mode 'turns' is unknown: use one of first_turn, conversation"):
        draw(Dataset(SHAREGPT, mode="turns"), 1, WORDS, seed=0, boot=0, sample=1)


# --------------------------------------------------------------------------- jobs


def test_a_samples_jobs_follow_its_workload(monkeypatch):
    monkeypatch.setattr("bisect_harness.measure.workloads.dataset_lengths", lambda *a: WORDS)
    bench = BenchmarkSpec(api="completions", prompt_tokens=8, output_tokens=5, seed=2)
    url = "http://127.0.0.1:9"

    first = workload_jobs(BenchmarkSpec(**{**bench.__dict__, "workload": Dataset(SHAREGPT)}), url, "m", 4,
                          boot=1, sample=1)
    assert len(first) == 4 and all(isinstance(j, RequestJob) for j in first)
    for job, d in zip(first, draw(Dataset(SHAREGPT), 4, WORDS, seed=2, boot=1, sample=1)):
        (prompt, out), = d.turns
        assert job.payload["prompt"] == prompt and job.payload["max_tokens"] == job.most == out
        assert job.url == url + "/v1/completions" and job.payload["model"] == "m"

    # drawn by the round: boots 5 and 6, the first boots of two arms, send the same conversations
    arm = BenchmarkSpec(**{**bench.__dict__, "workload": Dataset(SHAREGPT)})
    by_boot = {(b, seq): [j.payload["prompt"] for j in workload_jobs(arm, url, "m", 4, boot=b, sample=2,
                                                                     boot_seq=seq)]
               for b, seq in ((5, 1), (6, 1), (7, 2))}
    assert by_boot[5, 1] == by_boot[6, 1] != by_boot[7, 2]

    sessions = workload_jobs(BenchmarkSpec(**{**bench.__dict__, "workload": MultiTurn(turns=3, think_s=0.5)}), url,
                             "m", 7, boot=1, sample=1)
    assert len(sessions) == 3 and all(isinstance(j, SessionJob) and len(j.turns) == 3 for j in sessions)
    users = [t.user for s in sessions for t in s.turns]
    assert len(set(users)) == 9 and {len(u.split()) for u in users} == {8}
    assert all(t.max_tokens == 5 for s in sessions for t in s.turns) and sessions[0].think_s == 0.5

    conv = workload_jobs(BenchmarkSpec(**{**bench.__dict__, "workload": Dataset(SHAREGPT, mode="conversation")}),
                         url, None, 5, boot=1, sample=2)
    assert all(isinstance(j, SessionJob) for j in conv) and sum(len(j.turns) for j in conv) >= 5

    shared = workload_jobs(BenchmarkSpec(**{**bench.__dict__, "workload": SharedPrefix(2, 16, 3)}), url, "m", 6,
                           words=10, boot=1, sample=1)
    assert [j.payload["prompt"] for j in shared] == shared_prefix_prompts(
        SharedPrefix(2, 16, 3), bench, 6, 10, boot=1, sample=1)


# --------------------------------------------------------------------------- shared prefixes


def _common_words(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a.split(), b.split()):
        if x != y:
            break
        n += 1
    return n


def test_shared_prefix_prompts_share_exactly_their_groups_prefix():
    bench = BenchmarkSpec(prompt_tokens=12, seed=4)
    wl = SharedPrefix(groups=3, prefix_tokens=40, suffixes=4)
    prompts = shared_prefix_prompts(wl, bench, 12, boot=7, sample=1)
    assert len(prompts) == 12 and len(set(prompts)) == 12
    assert {len(p.split()) for p in prompts} == {40 + 12}
    groups = [prompts[0:4], prompts[4:8], prompts[8:12]]  # a group's requests one after another
    for group in groups:
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                assert _common_words(a, b) == 40, (a, b)  # the prefix, and not one word more
    for g, h in ((0, 1), (0, 2), (1, 2)):
        assert all(_common_words(a, b) == 0 for a in groups[g] for b in groups[h])
    # the next sample of the boot: the same prefixes (reuse inside a boot is the point), suffixes of its own
    later = shared_prefix_prompts(wl, bench, 12, boot=7, sample=2)
    assert [p.split()[:40] for p in later] == [p.split()[:40] for p in prompts]
    assert not set(later) & set(prompts)
    assert all(_common_words(a, b) == 40 for a, b in zip(prompts, later))
    # the next boot: fresh prefixes, as long
    other = shared_prefix_prompts(wl, bench, 12, boot=8, sample=1)
    assert all(_common_words(a, b) == 0 for a in prompts for b in other)
    assert {len(p.split()) for p in other} == {52}
    # more requests than groups x suffixes: the groups come round again, every suffix its own
    more = shared_prefix_prompts(wl, bench, 30, boot=7, sample=1)
    assert more[:12] == prompts and len(set(more)) == 30
    assert [p.split()[:40] for p in more[12:24]] == [p.split()[:40] for p in prompts]


def test_a_prefix_is_as_long_as_the_boots_fitted_words_make_it():
    """Where the server's tokenizer fitted ``prompt_tokens`` to a number of words, a prefix of
    ``prefix_tokens`` gets as many words in proportion."""
    bench = BenchmarkSpec(prompt_tokens=20)
    prompts = shared_prefix_prompts(SharedPrefix(1, 100, 2), bench, 2, 15, boot=1, sample=1)
    assert [len(p.split()) for p in prompts] == [75 + 15, 75 + 15]
    assert _common_words(*prompts) == 75

"""Conversations from a local dataset file (``workload.Dataset``): read once per process,
checked entry by entry, and drawn with a seed.

Two layouts, told apart by the file's first character:

* JSON (``[``): a list of entries, as ShareGPT ships them:
  ``{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}, ...]}``;
* JSONL (``{``): one entry a line, ShareGPT's or OpenAI's
  ``{"messages": [{"role": "user", "content": ...}, {"role": "assistant", ...}, ...]}``.

Either key may hold messages of either form (``from``/``value`` or ``role``/``content``; a
content may be a list of text parts). A conversation is what its messages hold up to the first
break of their user-reply alternation: leading system messages, then (user turn, reply) pairs.
One with no such pair, or with a role that is none of these (a tool's), or a part that is not
text, is left out and counted, with where the first such was (:attr:`DatasetFile.left_out`).
A file that is not JSON, or an entry or a message of the wrong shape, is a
:class:`~bisect_harness.errors.DatasetError` that names the file, the line (JSONL) or the index
(JSON), and the shape a usable entry has; so is a file with no usable conversation.

A draw (:func:`draw`) takes a sample's conversations from its boot's queue: the file's
conversations in an order fixed by the benchmark's seed and the boot, those that pass the
length filters kept, measured by :class:`Lengths` (the server's tokenizer where it has one,
else words); each sample from its own place in the queue, so the samples of a boot send
conversations of their own while the file lasts. ``first_turn``: one conversation a request
(its first user turn the prompt, its reply's length the output); ``conversation``: whole
conversations, a request a turn. The same numbers draw the same conversations on any server
with the same tokenizer, so both arms of a round that pass the same numbers send the same
traffic.
"""

from __future__ import annotations

import json
import os
import random
import threading
from collections import Counter as Tally
from dataclasses import dataclass
from typing import Any, Callable

from bisect_harness.errors import DatasetError
from bisect_harness.workload import Dataset

__all__ = ["DATASET_MODES", "Conversation", "DatasetFile", "Drawn", "Lengths", "draw", "read_dataset"]

#: ``workload.Dataset.mode``: the first user turn of each conversation as a request, or each
#: conversation replayed as a session, a request a turn.
DATASET_MODES = ("first_turn", "conversation")

#: A message's role as the file writes it -> the role it plays (the chat API's name).
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
          "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system"}

_SHAPE = ("a usable entry is ShareGPT's {\"conversations\": [{\"from\": \"human\", \"value\": TEXT}, "
          "{\"from\": \"gpt\", \"value\": TEXT}, ...]} or OpenAI's {\"messages\": [{\"role\": \"user\", "
          "\"content\": TEXT}, {\"role\": \"assistant\", \"content\": TEXT}, ...]}, in a JSON list or one a "
          "line (JSONL)")


@dataclass(frozen=True)
class Conversation:
    """One usable conversation: where the file holds it (``index 12``, ``line 13``), its system
    prompt (None: none), its (user turn, reply) pairs in order."""

    where: str
    system: str | None
    turns: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class DatasetFile:
    """A dataset file as read: its entries, the usable conversations, and why the others were
    left out (``(reason, how many, where the first was)``)."""

    path: str
    entries: int
    conversations: tuple[Conversation, ...]
    left_out: tuple[tuple[str, int, str], ...] = ()

    def describe(self) -> str:
        text = f"{self.path}: {len(self.conversations)} usable conversations of {self.entries} entries"
        if self.left_out:
            text += "; left out: " + "; ".join(f"{n} {why} (first at {where})" for why, n, where in self.left_out)
        return text


@dataclass(frozen=True)
class Lengths:
    """How a dataset's texts are measured for its filters and outputs: ``count(text)`` in
    ``unit`` (``tokens``, counted by the server's tokenizer ``via``; or ``words``)."""

    count: Callable[[str], int]
    unit: str = "words"
    via: str | None = None

    @classmethod
    def words(cls) -> "Lengths":
        return cls(lambda text: len(text.split()), "words")


@dataclass(frozen=True)
class Drawn:
    """A conversation drawn for a sample: where the file holds it, its system prompt (sent in
    ``conversation`` mode only), and its turns as (user turn, the reply's length: the output
    the request asks for)."""

    where: str
    system: str | None
    turns: tuple[tuple[str, int], ...]


# --------------------------------------------------------------------------- reading

_CACHE: dict[str, tuple[tuple[int, int], DatasetFile]] = {}
_LOCK = threading.Lock()


def read_dataset(path: str) -> DatasetFile:
    """The file at ``path``, read and checked (module docstring); read once per process while
    its modification time and size stay what they were. :class:`DatasetError` where it cannot
    be read, is malformed, or has no usable conversation."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise DatasetError(f"cannot read dataset {path}: {e.strerror or e}. Check the dataset's path in "
                           "benchmark.workload") from None
    stamp = (st.st_mtime_ns, st.st_size)
    key = os.path.realpath(path)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        parsed = _parse(path)
        _CACHE[key] = (stamp, parsed)
        return parsed


def _parse(path: str) -> DatasetFile:
    try:
        with open(path, "rb") as f:
            raw = f.read()
        text = raw.decode("utf-8-sig")
    except OSError as e:
        raise DatasetError(f"cannot read dataset {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise DatasetError(f"dataset {path} is not UTF-8 text (byte {e.start}): save it as UTF-8 JSON or "
                           "JSONL") from None
    head = text.lstrip()[:1]
    if not head:
        raise DatasetError(f"dataset {path} is empty; {_SHAPE}")
    entries: list[tuple[str, Any]] = []
    if head == "[":
        try:
            data = json.loads(text)
        except ValueError as e:
            raise DatasetError(f"dataset {path} is not valid JSON ({_decode_where(e)}); {_SHAPE}") from None
        if not isinstance(data, list):
            raise DatasetError(f"dataset {path} is JSON but not a list of conversations; {_SHAPE}")
        entries = [(f"index {i}", e) for i, e in enumerate(data)]
    elif head == "{":
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                entries.append((f"line {n}", json.loads(line)))
            except ValueError as e:
                raise DatasetError(f"dataset {path} line {n} is not a JSON object on one line ({e}); "
                                   f"{_SHAPE}: fix or remove the line") from None
    else:
        raise DatasetError(f"dataset {path} starts with {head!r}: it is neither a JSON list ('[') nor JSONL "
                           f"(a JSON object a line); {_SHAPE}")
    usable, left, first = [], Tally(), {}
    for where, entry in entries:
        conv = _conversation(path, where, entry)
        if isinstance(conv, str):
            left[conv] += 1
            first.setdefault(conv, where)
        else:
            usable.append(conv)
    out = DatasetFile(path, len(entries), tuple(usable), tuple((why, n, first[why]) for why, n in left.items()))
    if not usable:
        raise DatasetError(f"dataset {path} has no usable conversation: {out.describe()}. A usable one starts "
                           f"(after any system messages) with a user turn followed by a reply; {_SHAPE}")
    return out


def _decode_where(e: ValueError) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"line {e.lineno} column {e.colno}: {e.msg}"
    return str(e)


def _conversation(path: str, where: str, entry: Any) -> Conversation | str:
    """The usable conversation of one entry, or why it is left out (a str); a
    :class:`DatasetError` where the entry is malformed."""

    def bad(problem: str) -> DatasetError:
        return DatasetError(f"dataset {path} {where}: {problem}; {_SHAPE}: fix or remove the entry")

    if not isinstance(entry, dict):
        raise bad(f"the entry is {type(entry).__name__}, not an object")
    key = "conversations" if "conversations" in entry else "messages" if "messages" in entry else None
    if key is None:
        raise bad(f"the entry has neither 'conversations' nor 'messages' (its keys: {', '.join(sorted(entry))[:200]})")
    messages = entry[key]
    if not isinstance(messages, list):
        raise bad(f"'{key}' is {type(messages).__name__}, not a list of messages")
    said: list[tuple[str, str]] = []
    for k, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad(f"{key}[{k}] is {type(m).__name__}, not an object")
        role = m.get("from", m.get("role"))
        if not isinstance(role, str):
            raise bad(f"{key}[{k}] has no role: give 'from' (ShareGPT) or 'role' (OpenAI)")
        text = m.get("value", m.get("content"))
        if isinstance(text, list):  # OpenAI content parts
            if not all(isinstance(p, dict) for p in text):
                raise bad(f"{key}[{k}]'s content parts are not all objects")
            if any(p.get("type") != "text" or not isinstance(p.get("text"), str) for p in text):
                return "with a part that is not text"
            text = "".join(p["text"] for p in text)
        if text is None:
            return "with a message without text"
        if not isinstance(text, str):
            raise bad(f"{key}[{k}]'s text is {type(text).__name__}, not a string")
        if role.lower() not in _ROLES:
            return f"with a role other than user, assistant or system ({role!r})"
        said.append((_ROLES[role.lower()], text))
    system = []
    while said and said[0][0] == "system":
        system.append(said.pop(0)[1])
    turns = []
    for i in range(0, len(said) - 1, 2):
        (r1, user), (r2, reply) = said[i], said[i + 1]
        if r1 != "user" or r2 != "assistant" or not user.strip() or not reply.strip():
            break  # the alternation ends here: what came before is the conversation
        turns.append((user, reply))
    if not turns:
        return "without a user turn followed by a reply"
    return Conversation(where, "\n\n".join(system) if system else None, tuple(turns))


# --------------------------------------------------------------------------- drawing

def draw(ds: Dataset, requests: int, lengths: Lengths, *, seed: int, boot: int, sample: int) -> tuple[Drawn, ...]:
    """The conversations sample ``sample`` of boot ``boot`` sends, for ``requests`` requests
    (``first_turn``: one each; ``conversation``: whole conversations, one request a turn, the
    last may go past).

    The boot's queue: the file's conversations in an order drawn from ``(seed, boot)``, those
    that pass the filters (:func:`_fit`) kept. Sample ``s`` (from 1) takes from place
    ``(s - 1) * requests`` of the queue on, the warm-ups (``sample`` 0, -1, ...) from its far
    end, so the samples of a boot send conversations of their own until the queue is spent,
    and then come round it again (where the engine's cache serves those, its figures say so).
    No conversation twice in one sample: a :class:`DatasetError` where too few pass, saying
    how many did and why the others did not."""
    if ds.mode not in DATASET_MODES:
        raise DatasetError(f"dataset mode {ds.mode!r} is unknown: use one of {', '.join(DATASET_MODES)}")
    f = read_dataset(ds.path)
    order = list(range(len(f.conversations)))
    random.Random(f"dataset:{seed}:{boot}").shuffle(order)
    if sample < 1:  # a warm-up: from the far end
        order.reverse()
    start = (sample - 1 if sample >= 1 else -sample) * max(1, requests)
    queue: list[Drawn] = []
    left, first = Tally(), {}
    out: list[Drawn] = []
    sent = 0
    for i in order:  # the queue as far as this sample's place in it, then the sample
        conv = f.conversations[i]
        got = _fit(conv, ds, lengths)
        if isinstance(got, str):
            left[got] += 1
            first.setdefault(got, conv.where)
            continue
        queue.append(got)
        if len(queue) > start:
            out.append(got)
            sent += len(got.turns)
            if sent >= requests:
                return tuple(out)
    if queue:  # the queue is spent: round it again from this sample's place
        at = start % len(queue)
        out, sent = [], 0
        for got in queue[at:] + queue[:at]:
            out.append(got)
            sent += len(got.turns)
            if sent >= requests:
                return tuple(out)
    why = "; ".join(f"{n} {w} (first at {first[w]})" for w, n in left.items()) or "none left out"
    filters = ", ".join(f"{k}={getattr(ds, k)}" for k in ("min_prompt_tokens", "max_prompt_tokens",
                                                         "max_output_tokens") if getattr(ds, k) is not None)
    unit = f"tokens counted by the server's {lengths.via}" if lengths.via else lengths.unit
    raise DatasetError(f"dataset {ds.path}: a sample needs {requests} requests in mode {ds.mode}, and its "
                       f"{len(f.conversations)} usable conversations give {sent} that pass the filters ({filters}; "
                       f"lengths in {unit}): {why}. Use a larger dataset, wider filters or fewer requests a sample")


def _fit(conv: Conversation, ds: Dataset, lengths: Lengths) -> Drawn | str:
    """``conv`` as drawn in ``ds.mode``, or why it fails the filters. ``first_turn``: its first
    user turn is the prompt, within ``[min_prompt_tokens, max_prompt_tokens]``; ``conversation``:
    the longest prompt it sends (every turn and reply but the last reply, the system prompt
    included) is. Each reply it asks for is 1 to ``max_output_tokens`` long."""
    turns = conv.turns[:1] if ds.mode == "first_turn" else conv.turns
    count = lengths.count
    if ds.mode == "first_turn":
        prompt_text = [turns[0][0]]
    else:
        prompt_text = ([conv.system] if conv.system else []) + [t for u, r in turns for t in (u, r)][:-1]
    if lengths.unit == "tokens" and sum(len(t.encode()) for t in prompt_text) + 2 < ds.min_prompt_tokens:
        return "with a prompt under min_prompt_tokens"  # a token is a byte at least: no need to ask the server
    prompt = sum(count(t) for t in prompt_text)
    if prompt < ds.min_prompt_tokens:
        return "with a prompt under min_prompt_tokens"
    if ds.max_prompt_tokens is not None and prompt > ds.max_prompt_tokens:
        return "with a prompt over max_prompt_tokens"
    out = []
    for user, reply in turns:
        n = count(reply)
        if n < 1:
            return "with an empty reply"
        if ds.max_output_tokens is not None and n > ds.max_output_tokens:
            return "with a reply over max_output_tokens"
        out.append((user, n))
    return Drawn(conv.where, conv.system if ds.mode == "conversation" else None, tuple(out))

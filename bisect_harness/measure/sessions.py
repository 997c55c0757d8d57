"""A multi-turn session as one job of a sample (``jobs.Job``): its turns sent in order on one
client, each request carrying the conversation so far -- the system prompt, the earlier user
turns and the server's own replies -- then a new user turn; a pause between a reply and the
next turn (the user's think time).

The conversation travels in the API's own form (``Api.conversation_payload``): a messages list
for the chat API, one flattened prompt for the others, written so that each turn's prompt
begins with the whole of the previous turn's prompt and reply; a prefix cache serves that
part, and the engine's counters say how much it did (``cached_prompt_tokens``,
``prefix_cache_hit_share``). A turn that fails ends the session: its later turns are recorded
as failed, never sent (their history would not be the server's), so a sample counts them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from bisect_harness.measure.apis import Api
from bisect_harness.measure.request import MAX_SSE_LINE, Reading, RequestRecord, run_request

__all__ = ["SessionJob", "Turn"]


@dataclass(frozen=True)
class Turn:
    """One user turn of a session, and the most output tokens its reply may have."""

    user: str
    max_tokens: int


@dataclass(frozen=True)
class SessionJob:
    """The turns of one session, sent in order to ``url`` in ``api``'s form, ``think_s``
    seconds between a reply and the next turn; each request's own limits as a
    :class:`~bisect_harness.measure.jobs.RequestJob`'s."""

    url: str
    api: Api
    turns: tuple[Turn, ...]
    timeout_s: float
    temperature: float = 0.0
    ignore_eos: bool = True
    model: str | None = None
    seed: int = 0
    system: str | None = None
    think_s: float = 0.0
    max_line: int = MAX_SSE_LINE

    def messages(self, replies: tuple[str, ...]) -> list[tuple[str, str]]:
        """The conversation the next turn sends, after ``replies`` (one for each earlier turn):
        ``(role, text)`` pairs, the new user turn last."""
        out = [("system", self.system)] if self.system else []
        for turn, reply in zip(self.turns, replies):
            out += [("user", turn.user), ("assistant", reply)]
        return out + [("user", self.turns[len(replies)].user)]

    def run(self, http: httpx.Client, sample_t0: float) -> list[RequestRecord]:
        records: list[RequestRecord] = []
        replies: list[str] = []
        for k, turn in enumerate(self.turns):
            if k and self.think_s > 0:
                time.sleep(self.think_s)
            body = self.api.conversation_payload(self.messages(tuple(replies)), max_tokens=turn.max_tokens,
                                                 temperature=self.temperature, ignore_eos=self.ignore_eos,
                                                 model=self.model, seed=self.seed)
            rec = run_request(http, self.url, body, self.api, self.timeout_s, turn.max_tokens, sample_t0,
                              Reading(self.max_line, keep_text=True))
            records.append(rec)
            if not rec.ok:
                start = time.perf_counter() - sample_t0
                records += [_not_sent(start, k, j, rec.error) for j in range(k + 1, len(self.turns))]
                break
            replies.append(rec.text or "")
        return records


def _not_sent(start: float, failed: int, turn: int, why: str | None) -> RequestRecord:
    return RequestRecord(ok=False, error=f"turn {turn + 1} of its session not sent: turn {failed + 1} failed ({why})",
                         start_s=start, ttft_s=None, e2e_s=None, itl_s=None, tpot_s=None, output_tokens=0,
                         counted_tokens=0, chunks=0)

"""How long a boot's prompts are in tokens: the word count fitted to
``benchmark.prompt_tokens`` with the server's own tokenizer endpoint, where it has
one (:func:`size_prompts`); in words, and said so, where it has none."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from bisect_harness.measure.deadline import total_deadline
from bisect_harness.measure.prompts import request_prompt
from bisect_harness.model import BenchmarkSpec

__all__ = ["PromptSize", "reuse_text", "size_prompts", "token_counter"]


@dataclass(frozen=True)
class PromptSize:
    """How long a boot's prompts are. ``benchmark.prompt_tokens`` asks for tokens; the
    prompts are words, so where the server can count tokens (its ``/tokenize``) the word
    count is fitted to the asked tokens (``unit: tokens``); where it cannot, the prompt
    has ``prompt_tokens`` *words* and says so (``unit: words``). Each request's real
    count, where the server reports it, is the sample's ``prompt_tokens`` metric.
    ``unique``: each sample's prompts are its own (:func:`request_prompt`); ``spread``:
    how far the server's counts of the first request's prompt in other samples and
    boots were from ``tokens`` (0: alike; None: not counted)."""

    asked: int
    words: int
    unit: str                 # "tokens" | "words"
    tokens: int | None = None  # the server's count of the first prompt at ``words``
    via: str | None = None     # the endpoint that counted
    unique: bool = True
    spread: int | None = None

    def to_dict(self) -> dict:
        return {"asked": self.asked, "words": self.words, "unit": self.unit, "tokens": self.tokens, "via": self.via,
                "unique": self.unique, "spread": self.spread}

    def describe(self) -> str:
        if self.unit == "tokens":
            text = (f"prompts of {self.tokens} tokens ({self.words} words), {self.asked} asked, counted by the "
                    f"server's {self.via}")
        else:
            text = (f"prompts of {self.words} words ({self.asked} prompt_tokens asked): the server has no tokenizer "
                    f"endpoint, so the count is in words (about one token each in English)")
        return text + "; " + reuse_text(self.unique, self.spread)


def reuse_text(unique: bool, spread: int | None) -> str:
    """How a boot's prompts differ between samples, in words (the journal says it too)."""
    if not unique:
        return "the same prompts every sample and boot (benchmark.prompt_reuse: a prefix cache serves them)"
    alike = ("" if spread is None else ", as long in tokens in every sample" if spread == 0
             else f", their lengths in tokens up to {spread} apart between samples")
    return f"each request's prompt its own in every sample and boot (a seeded tag first){alike}"


#: Tokenizer endpoints tried, in order: (path, body builder, count reader). vLLM and
#: SGLang answer ``{"count": n, "tokens": [...]}`` to ``prompt``, llama.cpp
#: ``{"tokens": [...]}`` to ``content``, TGI a list of tokens to ``inputs``.
_TOKENIZERS = (
    ("/tokenize", lambda text, model: {"model": model, "prompt": text},
     lambda r: r.get("count", len(r.get("tokens") or [])) if isinstance(r, dict) and ("count" in r or "tokens" in r)
     else None),
    ("/tokenize", lambda text, model: {"content": text},
     lambda r: len(r["tokens"]) if isinstance(r, dict) and isinstance(r.get("tokens"), list) else None),
    ("/tokenize", lambda text, model: {"inputs": text}, lambda r: len(r) if isinstance(r, list) else None),
)


def token_counter(http: httpx.Client, base_url: str, model: str | None, probe: str):
    """A function text -> the server's token count, and its name; (None, None) where
    no tokenizer endpoint answers."""
    for path, body, read in _TOKENIZERS:
        def count(text: str, path=path, body=body, read=read) -> int | None:
            try:
                # Connection: close: a server that answers an unknown route without
                # reading the body (as Python's http.server handlers often do) would leave
                # that body in a kept-alive connection, to be read as the start of the
                # next request -- the boot's first benchmark request
                with total_deadline(10.0):  # the whole answer, however slowly it comes
                    r = http.post(base_url.rstrip("/") + path, json=body(text, model), timeout=10.0,
                                  headers={"Connection": "close"})
                if r.status_code != 200:
                    return None
                n = read(r.json())
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                return None
            return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None

        if count(probe) is not None:
            return count, f"POST {path} ({', '.join(body('', model))})"
    return None, None


def size_prompts(http: httpx.Client, base_url: str, bench: BenchmarkSpec, *, boot: int = 0) -> PromptSize:
    """Fit the prompts' word count to ``bench.prompt_tokens`` tokens with the server's
    tokenizer (a few counts of the first prompt), or keep words where it has none; then
    count the first request's prompt as the warm-up, another sample and another boot
    send it, to say whether they are as long (``PromptSize.spread``)."""
    asked = bench.prompt_tokens
    unique = not bench.prompt_reuse

    def first(words: int, b: int = boot, sample: int = 1) -> str:
        return request_prompt(bench, 0, words, boot=b, sample=sample)

    count, via = token_counter(http, base_url, bench.model, first(asked))
    if count is None:
        return PromptSize(asked, asked, "words", unique=unique)
    best: tuple[int, int, int] | None = None  # (distance, words, tokens)
    words = asked
    for _ in range(5):
        n = count(first(words))
        if n is None:
            break
        if best is None or abs(n - asked) < best[0]:
            best = (abs(n - asked), words, n)
        if n == asked:
            break
        nxt = max(1, round(words * asked / n))
        if nxt == words:
            nxt = words + (1 if n < asked else -1)
        if nxt < 1:
            break
        words = nxt
    if best is None:
        return PromptSize(asked, asked, "words", unique=unique)
    spread = None
    if unique:
        others = [count(first(best[1], b, sample)) for b, sample in ((boot, 0), (boot, 2), (boot + 1, 1))]
        if all(n is not None for n in others):
            spread = max(abs(n - best[2]) for n in others)
    return PromptSize(asked, best[1], "tokens", best[2], via, unique, spread if unique else 0)

"""The prompts a boot sends: common English words, fixed by the benchmark's seed, each
request's its own in every sample and boot so that no prefix cache serves one from
another (:func:`request_prompt`), or the same every time with
``benchmark.prompt_reuse``. Their length in tokens is fitted by ``prompt_size``."""

from __future__ import annotations

import hashlib
import random

from bisect_harness.model import BenchmarkSpec

__all__ = ["draw_number", "numbered_prompt", "request_prompt", "synthetic_prompt"]

_WORDS = (
    "the of and to in is was for on that with as by at from his her they this which "
    "be or had are not but were one all an their has been have there who more when "
    "will would can if no out so what up its about into than them only other new some "
    "time could these two may then first any like now my over such our man me even most "
    "made after also did many before must through back years where much your way well "
    "down should because each just those people how too little state good very make "
    "world still own see men work long get here between both life being under never day "
    "same another know while last might us great old year off come since against go "
    "came right used take three river city music garden window paper light water stone"
).split()


def synthetic_prompt(n_words: int, seed: int, index: int = 0) -> str:
    """About ``n_words`` common English words (roughly one token each), fixed by
    ``(seed, index)``: the body of request ``index``'s prompt (:func:`request_prompt`)."""
    rng = random.Random(f"{seed}:{index}")
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, n_words)))


#: The words of a prompt's tag (:func:`request_prompt`): 32 of the commonest English
#: words, each one token in the usual vocabularies (SentencePiece and byte-level BPE
#: alike, with a leading space or without), and each three letters, so that a
#: tokenizer that falls back on bytes counts every tag alike too; none starts with
#: "a", which a small vocabulary holding the article merges with the letters after it.
_TAG_WORDS = ("the big for end but not you far few can had her was one our out day get has him his how man new "
              "now old see two way who its let").split()
#: words in a tag at most: 32**6, about a billion tags
_TAG_MAX = 6


def _tag_length(words: int) -> int:
    """How many of a prompt's ``words`` are its tag: at most :data:`_TAG_MAX`, at most
    half the prompt; fixed by the prompt's length alone, so every prompt of a boot has it."""
    return min(_TAG_MAX, max(1, words // 2))


def request_prompt(bench: BenchmarkSpec, index: int, words: int | None = None, *, boot: int = 0,
                   sample: int = 1) -> str:
    """The prompt of request ``index`` of sample ``sample`` (0: the warm-up) of boot ``boot``,
    ``words`` words long (None: ``prompt_tokens`` words).

    Each prompt starts with a tag, a few words drawn from a hash of ``(seed, boot, sample,
    index)``, and goes on with request ``index``'s body (:func:`synthetic_prompt`) in an
    order drawn from the same hash. No two prompts of a config share a prefix beyond a
    chance word or two (1 in 32 share the first word), so no prefix cache (llama-server's
    prompt cache, SGLang's radix cache, vLLM's prefix caching) serves a later sample or
    boot, and a chunk cache (llama.cpp's ``--cache-reuse``) finds the body's chunks
    reordered. Request ``index``'s prompt has the same words in every sample and boot
    (the tag's aside, which are all three letters), so the same length in tokens
    wherever a tokenizer splits on spaces or counts bytes.

    With ``benchmark.prompt_reuse: true`` every sample and boot sends the same prompts
    (the tag and the body's order depend on ``index`` alone), so a prefix cache serves
    them: for measuring the cache itself.
    """
    n = max(1, words if words is not None else bench.prompt_tokens)
    key = f"{bench.seed}:reuse:{index}" if bench.prompt_reuse else f"{bench.seed}:{boot}:{sample}:{index}"
    return numbered_prompt(n, draw_number(key), bench.seed, index, None if bench.prompt_reuse else key)


def draw_number(key: str) -> int:
    """A number fixed by ``key`` (a hash of it, 64 bits): a prompt's tag (:func:`numbered_prompt`)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def numbered_prompt(words: int, number: int, seed: int, index: int, shuffle: str | None) -> str:
    """``words`` words: a tag that spells ``number`` in base 32 with the tag words, its
    lowest digit first (so numbers one apart differ in the first word, and any 32 numbers in
    a row in it), then request ``index``'s body (:func:`synthetic_prompt`), its words in an
    order drawn from ``shuffle`` (None: as drawn). The tag is :func:`_tag_length` words, so
    up to ``32 ** 6`` numbers in a row give tags of their own."""
    n = max(1, words)
    k = _tag_length(n)
    tag = []
    for _ in range(k):  # the low digits first: the first word varies fastest
        number, digit = divmod(number, len(_TAG_WORDS))
        tag.append(_TAG_WORDS[digit])
    body = synthetic_prompt(n - k, seed, index).split() if n > k else []
    if shuffle is not None:
        random.Random(shuffle).shuffle(body)
    return " ".join(tag + body)

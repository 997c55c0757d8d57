"""The streaming APIs the client speaks (``benchmark.api``), one class each.

Each kind builds its request and reads its stream, one JSON object at a time:
which objects carried output text, the server's own running count of output
tokens (checked by the stream: never believed blindly), and what the server said
of the request as a whole (usage, ``meta_info``, llama.cpp's ``timings``), which
``from: response`` metric sources read. A kind also says which object ends its
stream (:meth:`Api.ends`; ``data: [DONE]`` ends any): a stream that stops before it
was cut short. It says which failures the server means as "try again"
(:meth:`Api.retryable`): the client sends such a request, and one that produced
nothing, again within the sample and counts it.

============  ===========================  ====================================================
api           endpoint                     stream
============  ===========================  ====================================================
completions   ``POST /v1/completions``     OpenAI: ``choices[].text``, ``usage`` (vLLM, SGLang,
                                           llama.cpp's OpenAI endpoint, TGI's, ...)
chat          ``POST /v1/chat/completions``  OpenAI chat: ``choices[].delta.content``, ``usage``
generate      ``POST /generate``           SGLang native: cumulative ``text``, ``meta_info``
llamacpp      ``POST /completion``         llama.cpp native: ``content``, ``stop``; the last
                                           object has ``tokens_predicted`` and ``timings``
                                           (``prompt_n``, ``cache_n``, ``draft_n`` ...)
tgi           ``POST /generate_stream``    Text Generation Inference: ``token.text`` (one
                                           token an event), ``details.generated_tokens``
============  ===========================  ====================================================

    >>> get_api("llamacpp").payload(prompt="the river", max_tokens=8, temperature=0.0,
    ...                             ignore_eos=True, model=None, seed=0)["n_predict"]
    8
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar, Protocol, Sequence

from bisect_harness.errors import ServerReplyError
from bisect_harness.kinds import Registry

__all__ = ["Api", "APIS", "ROLES", "ReadyProbe", "StreamError", "flatten", "get_api"]


@dataclasses.dataclass(frozen=True)
class ReadyProbe:
    """How a kind tells that its server is ready where the server has no health route
    (``engine.health`` answers 404: llama.cpp's server before its ``/health``, a
    bare OpenAI-compatible server): a request that passes only once the server can
    do the kind's work. A body makes it a one-token generation."""

    method: str
    path: str
    body: dict | None = None

    def describe(self) -> str:
        return f"{self.method} {self.path}" + (" (one token)" if self.body is not None else "")


class StreamError(ServerReplyError):
    """A stream that cannot be believed: a field of the wrong shape, a count that
    cannot be true, an error the server put in the stream."""


class Reader(Protocol):
    """What a kind writes to while it reads a stream (``request._Stream``)."""

    usage: dict | None
    meta: dict | None
    last: dict | None  # the last JSON object of the stream so far

    prev_text: str

    def output(self, now: float, k: int | None) -> None: ...     # a chunk carried output (k tokens; None: unknown)
    def said(self, text: str, *, whole: bool = False) -> None: ...  # more of the output's text (whole: all so far)
    def count(self, value: Any, where: str) -> int | None: ...  # the server's running count, checked: tokens since
                                                                 # its last count (None where it sent none)


def shape(value: Any) -> str:
    """A short description of an unexpected JSON value, for a failure's reason."""
    text = json.dumps(value, default=str)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _string(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise StreamError(f"chunk's {where} is {shape(value)}, not a string")
    return value


def _object(value: Any, where: str) -> dict | None:
    if value is not None and not isinstance(value, dict):
        raise StreamError(f"chunk's {where} is {shape(value)}, not an object")
    return value


class Api:
    """One streaming API: its path, its request, how to read one object of its stream."""

    name: ClassVar[str]
    path: ClassVar[str]
    #: the model name is part of the request (read from ``GET /v1/models`` unless
    #: ``benchmark.model`` says it)
    needs_model: ClassVar[bool] = False
    #: readiness where the server has no health route (see :class:`ReadyProbe`)
    ready_probe: ClassVar[ReadyProbe]
    #: what ends this kind's stream, in words (:meth:`ends`), for a failed request's reason
    end: ClassVar[str]

    def payload(self, *, prompt: str, max_tokens: int, temperature: float, ignore_eos: bool, model: str | None,
                seed: int) -> dict:
        raise NotImplementedError

    def conversation_payload(self, messages: Sequence[tuple[str, str]], *, max_tokens: int, temperature: float,
                             ignore_eos: bool, model: str | None, seed: int) -> dict:
        """The request that continues a conversation: ``messages`` are ``(role, text)`` pairs
        (``system``, ``user``, ``assistant``), the last a user turn. An API that takes a prompt
        gets the conversation flattened into one (:func:`flatten`), so each turn's prompt starts
        with the whole of the previous turn's prompt and reply, as a prefix cache wants it."""
        return self.payload(prompt=flatten(messages), max_tokens=max_tokens, temperature=temperature,
                            ignore_eos=ignore_eos, model=model, seed=seed)

    def read(self, st: Reader, obj: dict, now: float) -> None:
        raise NotImplementedError

    def ends(self, obj: dict) -> bool:
        """Does this object of the stream end it (the server is done with the request)?
        ``data: [DONE]`` ends every kind's stream as well."""
        raise NotImplementedError

    def retryable(self, status: int, body: str) -> bool:
        """Does the server mean "try again" (a request it never started)? 503 and 429
        (overloaded, rate limited) for every kind."""
        return status in (429, 503)

    def prompt_tokens(self, st: Reader) -> int | None:
        """The prompt's length as the server counted it, where its stream said."""
        for where, key in ((st.usage, "prompt_tokens"), (st.meta, "prompt_tokens")):
            n = (where or {}).get(key)
            if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
                return n
        return None

    def cached_tokens(self, st: Reader) -> int | None:
        """The prompt's tokens the server took from its prefix cache, where its stream
        said: OpenAI's ``usage.prompt_tokens_details.cached_tokens`` (llama.cpp always;
        vLLM with ``--enable-prompt-tokens-details``; SGLang with ``--enable-cache-report``),
        SGLang's ``meta_info.cached_tokens``."""
        details = (st.usage or {}).get("prompt_tokens_details")
        return _count((details if isinstance(details, dict) else {}).get("cached_tokens"),
                      (st.meta or {}).get("cached_tokens"))

    def evaluated_tokens(self, st: Reader) -> int | None:
        """The prompt's tokens the server computed (not taken from a cache), where it
        said: llama.cpp's ``timings.prompt_n`` in the last object of either of its APIs."""
        timings = (st.last or {}).get("timings")
        return _count(timings.get("prompt_n")) if isinstance(timings, dict) else None


#: The roles of a conversation's messages (:meth:`Api.conversation_payload`), as the chat
#: API names them, and how :func:`flatten` writes each into a prompt.
ROLES = {"system": "System: ", "user": "User: ", "assistant": "Assistant:"}


def flatten(messages: Sequence[tuple[str, str]]) -> str:
    """A conversation as one prompt: each message after its role (``User: ``, ``Assistant:``,
    ``System: ``), a blank line between them, and ``Assistant:`` last, where the reply goes.
    A reply is written as the server sent it, right after ``Assistant:``, so the prompt of
    turn k+1 begins with the whole prompt of turn k and its reply.

        >>> flatten([("user", "hi"), ("assistant", " hello"), ("user", "more")])
        'User: hi\n\nAssistant: hello\n\nUser: more\n\nAssistant:'
    """
    parts = []
    for role, text in messages:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r} in a conversation: use one of {', '.join(ROLES)}")
        parts.append(ROLES[role] + text)
    return "\n\n".join(parts + [ROLES["assistant"]])


def _count(*values: Any) -> int | None:
    """The first of ``values`` that is a whole, non-negative number of tokens."""
    for n in values:
        if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
            return n
    return None


class Completions(Api):
    name, path, needs_model = "completions", "/v1/completions", True
    # an OpenAI server lists its models once they are loaded
    ready_probe = ReadyProbe("GET", "/v1/models")
    end = "data: [DONE] or a choice's finish_reason"

    def ends(self, obj):
        choices = obj.get("choices")
        return isinstance(choices, list) and any(isinstance(c, dict) and c.get("finish_reason") is not None
                                                 for c in choices)

    def payload(self, *, prompt, max_tokens, temperature, ignore_eos, model, seed):
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
                "stream": True, "stream_options": {"include_usage": True}}
        if ignore_eos:
            # A vLLM/SGLang extension: strict OpenAI servers (transformers serve) answer 422
            # to any field they do not know, so `benchmark.ignore_eos: false` leaves it out.
            body["ignore_eos"] = True
        return body

    def _text(self, choice: dict) -> str:
        return _string(choice.get("text"), "choices[].text")

    def read(self, st, obj, now):
        usage = _object(obj.get("usage"), "usage")
        choices = obj.get("choices")
        if choices is not None and not (isinstance(choices, list) and all(isinstance(c, dict) for c in choices)):
            raise StreamError(f"chunk's choices is {shape(choices)}, not a list of objects")
        k = None
        if usage:
            st.usage = usage
            k = st.count(usage.get("completion_tokens"), "usage.completion_tokens")  # continuous usage: exact
        for choice in choices or ():
            text = self._text(choice)
            if text:
                st.output(now, k)
                st.said(text)
                return


class Chat(Completions):
    name, path = "chat", "/v1/chat/completions"

    def payload(self, *, prompt, max_tokens, temperature, ignore_eos, model, seed):
        body = super().payload(prompt=prompt, max_tokens=max_tokens, temperature=temperature,
                               ignore_eos=ignore_eos, model=model, seed=seed)
        del body["prompt"]
        body["messages"] = [{"role": "user", "content": prompt}]
        return body

    def conversation_payload(self, messages, *, max_tokens, temperature, ignore_eos, model, seed):
        body = self.payload(prompt="", max_tokens=max_tokens, temperature=temperature, ignore_eos=ignore_eos,
                            model=model, seed=seed)
        body["messages"] = [{"role": role, "content": text} for role, text in messages]
        return body

    def _text(self, choice):
        delta = _object(choice.get("delta"), "choices[].delta") or {}
        return _string(delta.get("content"), "choices[].delta.content")


class Generate(Api):
    name, path = "generate", "/generate"
    ready_probe = ReadyProbe("POST", "/generate", {"text": "ready", "sampling_params": {"max_new_tokens": 1}})
    end = "data: [DONE] or meta_info.finish_reason"

    def ends(self, obj):
        meta = obj.get("meta_info")
        return isinstance(meta, dict) and meta.get("finish_reason") is not None

    def payload(self, *, prompt, max_tokens, temperature, ignore_eos, model, seed):
        return {"text": prompt, "stream": True,
                "sampling_params": {"max_new_tokens": max_tokens, "temperature": temperature,
                                    "ignore_eos": ignore_eos}}

    def read(self, st, obj, now):
        text = _string(obj.get("text"), "text")  # cumulative
        meta = _object(obj.get("meta_info"), "meta_info")
        k = None
        if meta is not None:
            st.meta = meta
            k = st.count(meta.get("completion_tokens"), "meta_info.completion_tokens")
        if k is not None:
            if k > 0:  # tokens arrived even if the detokenizer held their text back
                st.output(now, k)
        elif text and text != st.prev_text:
            st.output(now, None)
        if text:  # cumulative: the whole output so far
            st.said(text, whole=True)
        st.prev_text = text


class LlamaCpp(Api):
    """llama.cpp's own ``/completion`` (every ``llama-server`` since 2023; its OpenAI
    endpoint came later). The last object (``stop: true``) carries the server's count
    (``tokens_predicted``) and its own ``timings`` (``predicted_per_second``,
    ``predicted_ms``, ``prompt_ms``, ...), kept as the request's ``meta_info``."""

    name, path = "llamacpp", "/completion"
    # the 2023 server has no /health; it loads the model before it listens
    ready_probe = ReadyProbe("POST", "/completion", {"prompt": "ready", "n_predict": 1})
    end = "an object with stop: true"

    def ends(self, obj):
        return obj.get("stop") is True

    def payload(self, *, prompt, max_tokens, temperature, ignore_eos, model, seed):
        return {"prompt": prompt, "n_predict": max_tokens, "temperature": temperature, "stream": True,
                "ignore_eos": ignore_eos, "seed": seed}

    def read(self, st, obj, now):
        content = _string(obj.get("content"), "content")
        stop = obj.get("stop")
        if stop is not None and not isinstance(stop, bool):
            raise StreamError(f"chunk's stop is {shape(stop)}, not true or false")
        if stop:
            _object(obj.get("timings"), "timings")
            st.meta = {key: v for key, v in obj.items() if key != "content"}
            st.count(obj.get("tokens_predicted"), "tokens_predicted")
        if content:  # one token or several a chunk: the split is the server's count, at the end
            st.output(now, None)
            st.said(content)

    def prompt_tokens(self, st):
        # the prompt's length, a prefix taken from the cache included: tokens_evaluated is
        # n_prompt_tokens = task->n_tokens() (tools/server/server-task.cpp and server-context.cpp,
        # llama.cpp in llama-cpp-python 0.3.36)
        return _count((st.meta or {}).get("tokens_evaluated"))

    def cached_tokens(self, st):
        # timings.cache_n: the prompt's tokens reused from the slot's cache (server_slot_stats::to_json);
        # a server without it: the prompt's tokens less those it computed (timings.prompt_n)
        timings = (st.meta or {}).get("timings")
        timings = timings if isinstance(timings, dict) else {}
        cached = _count(timings.get("cache_n"))
        if cached is not None:
            return cached
        total, computed = self.prompt_tokens(st), _count(timings.get("prompt_n"))
        return total - computed if total is not None and computed is not None and computed <= total else None

    def retryable(self, status, body):
        # the 2023 server answered a request it had no free slot for with "slot unavailable"
        return super().retryable(status, body) or "slot unavailable" in body


class Tgi(Api):
    """Hugging Face Text Generation Inference: one event per token; the last has
    ``details.generated_tokens`` (with ``details: true`` asked)."""

    name, path = "tgi", "/generate_stream"
    ready_probe = ReadyProbe("POST", "/generate", {"inputs": "ready", "parameters": {"max_new_tokens": 1}})
    end = "an event with details or generated_text"

    def ends(self, obj):
        return obj.get("details") is not None or obj.get("generated_text") is not None

    def payload(self, *, prompt, max_tokens, temperature, ignore_eos, model, seed):
        params: dict[str, Any] = {"max_new_tokens": max_tokens, "details": True, "seed": seed,
                                  "do_sample": temperature > 0}
        if temperature > 0:
            params["temperature"] = temperature
        return {"inputs": prompt, "parameters": params}

    def read(self, st, obj, now):
        token = _object(obj.get("token"), "token") or {}
        text = _string(token.get("text"), "token.text")
        details = _object(obj.get("details"), "details")
        if details is not None:
            st.meta = details
            st.count(details.get("generated_tokens"), "details.generated_tokens")
        if text and not token.get("special"):
            st.output(now, 1)  # an event is a token
            st.said(text)


#: name -> API (``benchmark.api``), in the order defined.
APIS: Registry[Api] = Registry("benchmark api")
for _api in (Completions(), Chat(), Generate(), LlamaCpp(), Tgi()):
    APIS.add(_api)


def get_api(name: str) -> Api:
    try:
        return APIS[name]
    except KeyError:
        raise ValueError(f"unknown benchmark api {name!r}: use one of {', '.join(APIS)}") from None

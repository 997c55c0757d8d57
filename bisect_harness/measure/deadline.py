"""Total deadlines on the harness's HTTP exchanges: a read ends at its deadline however
slowly the server sends its bytes.

httpx's own timeout bounds each network read: a server that sends one byte a
second (headers or body) restarts it with every byte and keeps the caller waiting
as long as it likes. Here every connect, write and read of a client made by
:func:`deadline_client` is given only what is left of the deadline the calling
thread is under (:func:`total_deadline`), and none starts once it has passed: the
exchange then fails with httpx's timeout error (``httpx.ReadTimeout``, say) whose
message names the deadline. Without a deadline set, such a client behaves as any.

:func:`stream_within` is how the harness reads a response: readiness probes
(``engines.server``), benchmark requests (``measure.request``), server info and
``/metrics`` (``measure.bodies``, read by ``measure.values`` and the metric sources)::

    http = deadline_client()
    with stream_within(http, "GET", url, 10.0) as resp:   # 10 s in all, headers included
        for piece in resp.iter_raw():
            ...

Deadlines nest: an inner one never reaches past the outer one.

Every client of the harness is made here, ignoring the environment (no proxy
variables, no ``SSL_CERT_*``) and sharing one TLS context per process: httpx builds
a context for each new client, loading the whole CA bundle, even when every request
goes to ``http://127.0.0.1`` (about 30 ms of CPU each on a quiet 2-core host,
several times that on a busy one, and a boot opens about eight clients).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import ssl
import time
import weakref
from typing import Any, Iterator, Mapping

import httpcore
import httpx

__all__ = ["deadline_client", "require_deadline_client", "seconds_left", "stream_within", "total_deadline"]

#: (monotonic end, seconds it was set for) of the deadline the current thread is under
_DEADLINE: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar("harness_deadline",
                                                                                       default=None)


@contextlib.contextmanager
def total_deadline(seconds: float) -> Iterator[None]:
    """Every network step of a :func:`deadline_client` in this thread, inside the block,
    ends within ``seconds`` from now (or the enclosing deadline, if that is sooner)."""
    end = time.monotonic() + max(0.0, float(seconds))
    outer = _DEADLINE.get()
    token = _DEADLINE.set((end, float(seconds)) if outer is None or end < outer[0] else outer)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def seconds_left() -> float | None:
    """What is left of the current deadline (never below 0), or None where none is set."""
    d = _DEADLINE.get()
    return None if d is None else max(0.0, d[0] - time.monotonic())


def _left(timeout: float | None, exc: type[Exception]) -> float | None:
    """``timeout`` cut to what is left of the deadline; ``exc`` once nothing is left."""
    d = _DEADLINE.get()
    if d is None:
        return timeout
    left = d[0] - time.monotonic()
    if left <= 0:
        raise exc(f"the total deadline of {d[1]:g} s passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    """A connection's stream whose every step is cut to the deadline."""

    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname: str | None = None, timeout: float | None = None):
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    """httpcore's own sockets, each wrapped in :class:`_Stream`."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        return _Stream(self._inner.connect_tcp(host, port, _left(timeout, httpcore.ConnectTimeout), local_address,
                                               socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _Stream(self._inner.connect_unix_socket(path, _left(timeout, httpcore.ConnectTimeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    """The process's one TLS context, as httpx builds it with ``trust_env=False``
    (certifi's bundle), built on the first client."""
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


class _Transport(httpx.HTTPTransport):
    """httpx's transport on a pool whose connections keep the deadline."""

    def __init__(self, limits: httpx.Limits) -> None:
        super().__init__(verify=_tls_context(), trust_env=False, limits=limits)
        # the pool httpx would make, with the backend above (httpx has no argument for it)
        self._pool = httpcore.ConnectionPool(
            ssl_context=_tls_context(), max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
            network_backend=_Backend())


_MADE: "weakref.WeakSet[httpx.Client]" = weakref.WeakSet()


def deadline_client(*, headers: Mapping[str, str] | None = None, timeout: Any = 30.0,
                    limits: httpx.Limits | None = None) -> httpx.Client:
    """An httpx client (no proxies or settings from the environment) whose exchanges
    keep the deadline they run under (:func:`total_deadline`, :func:`stream_within`)."""
    client = httpx.Client(transport=_Transport(limits or httpx.Limits()), verify=_tls_context(), trust_env=False,
                          headers=dict(headers or {}), timeout=timeout)
    _MADE.add(client)
    return client


def require_deadline_client(client: httpx.Client) -> None:
    """A TypeError unless ``client`` came from :func:`deadline_client`: another client's
    reads would restart their timeout with every byte."""
    if client not in _MADE:
        raise TypeError("this client does not keep a total deadline: make it with "
                        "bisect_harness.measure.deadline.deadline_client()")


@contextlib.contextmanager
def stream_within(client: httpx.Client | None, method: str, url: str, seconds: float,
                  **kwargs: Any) -> Iterator[httpx.Response]:
    """``client.stream(method, url, **kwargs)`` with everything, from the connection to
    the last byte read inside the block, within ``seconds`` in all. ``client`` must come
    from :func:`deadline_client` (None: one of its own for this exchange)."""
    if client is None:
        with deadline_client() as own, stream_within(own, method, url, seconds, **kwargs) as resp:
            yield resp
        return
    require_deadline_client(client)
    with total_deadline(seconds):
        try:
            with client.stream(method, url, timeout=kwargs.pop("timeout", max(seconds, 1e-3)), **kwargs) as resp:
                yield resp
        except httpx.TimeoutException as exc:
            if seconds_left() != 0:
                raise
            raise type(exc)(f"{method} {url} was not answered in full within its total deadline of "
                            f"{seconds:g} s") from exc

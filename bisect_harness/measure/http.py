"""The harness's HTTP clients: the environment's proxies and certificates ignored, one
TLS context per process.

Every client the harness opens to a server (readiness probes, server info, metrics,
the benchmark's requests) is made here. ``httpx`` builds a TLS context for each new
client, loading the whole CA bundle, even when every request goes to
``http://127.0.0.1``: about 30 ms of CPU each on a quiet 2-core host and several
times that on a busy one, and a boot opens about eight clients. The context is
built once, on the first client, the way ``httpx`` builds it with
``trust_env=False`` (certifi's bundle).
"""

from __future__ import annotations

import functools
import ssl

import httpx

__all__ = ["http_client"]


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def http_client(**options) -> httpx.Client:
    """An ``httpx.Client`` with ``options`` (headers, timeout, limits), ignoring the
    environment (``trust_env=False``: no proxy variables, no ``SSL_CERT_*``), with
    the process's one TLS context."""
    return httpx.Client(trust_env=False, verify=_tls_context(), **options)

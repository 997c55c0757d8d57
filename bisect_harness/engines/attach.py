"""Where a boot's server comes from: launched by the harness, or attached to.

An *engine source* gives the executor a port, an :class:`~bisect_harness.engines.benchtools.Endpoint`
(URL and headers) and a server to enter as a context manager::

    source = source_for(spec)                  # LaunchedSource or AttachedSource
    port = source.port(config)
    endpoint = source.endpoint(config, port)   # base_url + Authorization, never stored
    with source.open(argv, env=..., cwd=..., log_path=..., base_url=endpoint.base_url,
                     health_path=..., ready_timeout_s=...) as server:
        ...                                    # server.pid is None when attached

``LaunchedSource`` is :class:`~bisect_harness.engines.server.ServerProcess` on a free
loopback port. ``AttachedSource`` (``engine.base_url``) stands in for a server the
harness did not start (one already running, or a hosted endpoint): nothing is
built, launched or stopped, the readiness probe is the only step of "booting" it,
and each boot is one more measurement session of that same running server. So
boots of an attached config are not independent restarts: every verdict that uses
one says so (:func:`verdict_findings`).

The API key (``engine.api_key_env`` names the environment variable that holds it)
is read when a boot starts, sent as ``Authorization: Bearer ...`` and never
written anywhere: not in the ledger, the journal, the logs or any message.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence
from urllib.parse import urlsplit

import httpx

from bisect_harness.engines.benchtools import Endpoint
from bisect_harness.errors import BootFailed, BootTimeout, UserError
from bisect_harness.evidence import Finding, FindingKind
from bisect_harness.measure.deadline import deadline_client, total_deadline
from bisect_harness.engines.presets import LOOPBACK
from bisect_harness import secrets
from bisect_harness.secrets import redact_text

__all__ = ["LaunchedSource", "AttachedSource", "AttachedServer", "source_for", "api_key", "verdict_findings"]


def api_key(env_name: str | None) -> str | None:
    """The key from the variable ``engine.api_key_env`` names; UserError when unset."""
    if env_name is None:
        return None
    value = os.environ.get(env_name)
    if not value:
        raise UserError(f"engine.api_key_env: the environment variable {env_name} is not set (or empty); "
                        f"export {env_name}=<your key> before running, or remove engine.api_key_env")
    secrets.register([value])  # a server that echoes the request's headers never puts it in the record
    return value


def _auth(env_name: str | None) -> tuple[dict[str, str], str | None]:
    key = api_key(env_name)
    return ({"Authorization": f"Bearer {key}"} if key else {}), key


class LaunchedSource:
    """The harness launches the server itself, on a free loopback port."""

    attached = False

    def __init__(self, api_key_env: str | None = None):
        self.api_key_env = api_key_env

    def port(self, config) -> int:
        from bisect_harness.engines.server import free_port

        return free_port()

    def endpoint(self, config, port: int) -> Endpoint:
        headers, key = _auth(self.api_key_env)
        return Endpoint(f"http://{LOOPBACK}:{port}", host=LOOPBACK, port=port, headers=headers, api_key=key)

    def open(self, argv, **kwargs):
        from bisect_harness.engines.server import ServerProcess

        return ServerProcess(argv, **kwargs)


class AttachedSource:
    """A server that is already running at ``config.arm.endpoint``: a stand-in engine source."""

    attached = True

    def __init__(self, api_key_env: str | None = None):
        self.api_key_env = api_key_env

    def port(self, config) -> int | None:
        return urlsplit(config.arm.endpoint).port

    def endpoint(self, config, port) -> Endpoint:
        headers, key = _auth(self.api_key_env)
        return Endpoint(config.arm.endpoint.rstrip("/"), headers=headers, api_key=key)

    def open(self, argv, *, log_path: Path, base_url: str, health_path: str = "/health",
             ready_timeout_s: float = 120.0, ready_probe=None, **_launch_only) -> "AttachedServer":
        # env, cwd and the like describe a launch; an attached server has none.
        return AttachedServer(base_url, log_path=log_path, health_path=health_path,
                              ready_timeout_s=ready_timeout_s, api_key_env=self.api_key_env,
                              ready_probe=ready_probe)


class AttachedServer:
    """The context a boot of an attached server runs in: a readiness probe (with the
    API key) within ``ready_timeout_s``, a log of what was done, nothing to stop."""

    pid = None  # no process of ours: env checks and the contention monitor see no server tree

    def __init__(self, base_url: str, *, log_path: Path, health_path: str, ready_timeout_s: float,
                 api_key_env: str | None, poll_interval_s: float = 0.5, ready_probe=None):
        self.base_url = base_url.rstrip("/")
        self.log_path = Path(log_path)
        self.health_path = health_path
        self.ready_timeout_s = float(ready_timeout_s)
        self.api_key_env = api_key_env
        self.poll_interval_s = poll_interval_s
        self.ready_after_s: float | None = None
        self.ready_probe = ready_probe  # apis.ReadyProbe: used where health_path answers 404
        self.ready_by: str | None = None

    def _log(self, text: str) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as f:
            f.write(redact_text(text.rstrip("\n")) + "\n")  # secrets never written (secrets.py)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> "AttachedServer":
        url = self.base_url + self.health_path
        headers, _ = _auth(self.api_key_env)
        self._log(f"attached to {self.base_url} (not launched by the harness: nothing built, started or "
                  f"stopped); readiness: GET {self.health_path}"
                  + (f" with the key from ${self.api_key_env}" if self.api_key_env else ""))
        started = time.monotonic()
        deadline = started + self.ready_timeout_s
        last = "no answer"
        probe = None  # the API's probe, once health_path answered 404 (no such route)
        with deadline_client(headers=headers) as http:
            while True:
                remaining = deadline - time.monotonic()
                try:
                    timeout = max(0.05, min(10.0, remaining))
                    with total_deadline(timeout):  # the whole answer, however slowly it comes
                        if probe is None:
                            r = http.get(url, timeout=timeout)
                            by = f"GET {self.health_path}"
                        else:
                            r = http.request(probe.method, self.base_url + probe.path, json=probe.body,
                                             timeout=timeout, headers={"Connection": "close"})
                            by = f"{probe.describe()}, GET {self.health_path} answering 404"
                    if r.status_code == 200:
                        self.ready_after_s = time.monotonic() - started
                        self.ready_by = by
                        self._log(f"ready after {self.ready_after_s:.2f} s ({by})")
                        return self
                    last = f"HTTP {r.status_code}"
                    if r.status_code == 404 and probe is None and self.ready_probe is not None:
                        probe = self.ready_probe
                        self._log(f"GET {self.health_path}: 404 (no such route); readiness by {probe.describe()}")
                        continue
                    if r.status_code in (401, 403):
                        why = (f"the key in ${self.api_key_env} (engine.api_key_env) was refused"
                               if self.api_key_env else "it needs an API key: set engine.api_key_env to the "
                               "name of the environment variable that holds it")
                        self._log(f"GET {self.health_path}: {last}")
                        raise BootFailed(f"the attached server at {self.base_url} answered {last} to GET "
                                         f"{self.health_path}: {why}", log_tail=self.log_tail(),
                                         log_path=str(self.log_path))
                except httpx.HTTPError as exc:
                    last = type(exc).__name__
                if time.monotonic() >= deadline:
                    self._log(f"not ready: {last}")
                    raise BootTimeout(f"the attached server at {self.base_url} did not answer 200 to GET "
                                      f"{self.health_path} within {self.ready_timeout_s:g} s (last: {last}); "
                                      "check engine.base_url and that the server is up, or set engine.health "
                                      "to a path it serves", log_tail=self.log_tail(), log_path=str(self.log_path))
                time.sleep(max(0.0, min(self.poll_interval_s, deadline - time.monotonic())))

    def __exit__(self, *exc) -> None:
        self._log("measurement session over; the server keeps running (it is not the harness's)")


def source_for(spec) -> LaunchedSource | AttachedSource:
    """The engine source of a spec: attached when ``engine.base_url`` is set."""
    e = spec.engine
    return (AttachedSource if e.base_url is not None else LaunchedSource)(e.api_key_env)


def verdict_findings(configs: Sequence) -> list[Finding]:
    """The finding every verdict over an attached config carries: what its boots are
    (``attached``; figures ``endpoints``: the attached URLs, sorted)."""
    attached = [c for c in configs if getattr(c.arm, "endpoint", None)]
    if not attached:
        return []
    urls = sorted({c.arm.endpoint for c in attached})
    text = (f"attached server: the boots are measurement sessions of {' and '.join(urls)}, which the harness "
            "did not start; they are not independent restarts, so the interval covers the noise between "
            "sessions of one running server, not between starts of it (a restart, another host or a redeploy "
            "may land elsewhere)")
    return [Finding(FindingKind.ATTACHED, text, figures={"endpoints": urls})]

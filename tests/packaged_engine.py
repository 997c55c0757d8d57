"""A tiny engine installed as a package, laid out like SGLang (``pip install -e python``).

``make_packaged_engine(path, versions)`` writes a git repository with one commit
per version. Each commit's ``python/tinyengine/__init__.py`` carries that
``__version__``; the server (``python -m tinyengine.serve --port N``) reports it
in ``/server_info`` and ``/version``, and serves streamed OpenAI completions, so
a boot's reported version says which commit's code it imported. The server
lives under ``python/`` so that a launch from the worktree's root imports the
*installed* package, not the checkout (as with SGLang).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from helpers import git

PYPROJECT = """[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "tinyengine"
version = "{version}"
"""

SERVE = r'''"""A tiny OpenAI-compatible server: /health, /server_info, /version, /v1/models, /v1/completions."""

import argparse
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tinyengine import __version__


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):
        pass

    def _json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._json(200, {"ok": True})
        elif self.path == "/server_info":
            self._json(200, {"version": __version__, "model": "tiny"})
        elif self.path == "/version":
            self._json(200, {"version": __version__})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]})
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        req = json.loads(self.rfile.read(length) or b"{}")
        if self.path != "/v1/completions":
            self._json(404, {"error": "not found"})
            return
        n = int(req.get("max_tokens") or 8)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for i in range(n):
            time.sleep(0.002)
            chunk = {"object": "text_completion", "model": "tiny", "choices": [{"index": 0, "text": f" t{i}"}]}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
        usage = {"object": "text_completion", "model": "tiny", "choices": [],
                 "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}}
        self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args()
    ThreadingHTTPServer((a.host, a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
'''


def make_packaged_engine(path: Path, versions: Sequence[str]) -> list[str]:
    """A git repo at ``path`` with one commit per version, oldest first; returns their shas."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    pkg = path / "python" / "tinyengine"
    pkg.mkdir(parents=True)
    (pkg / "serve.py").write_text(SERVE)
    shas = []
    for v in versions:
        (path / "python" / "pyproject.toml").write_text(PYPROJECT.format(version=v))
        (pkg / "__init__.py").write_text(f'__version__ = "{v}"\n')
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", f"tinyengine {v}")
        shas.append(git(path, "rev-parse", "HEAD").strip())
    return shas


#: The build of SGLang's example, and its launch: the installed package, run by ``{python}``.
BUILD = ["{python}", "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", "python"]
LAUNCH = ["{python}", "-m", "tinyengine.serve", "--host", "{host}", "--port", "{port}"]

"""The version guard: what a server reports about its code, and mixed reports in one config."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from bisect_harness.evidence import BootEvidence, FindingKind
from bisect_harness.observe.engine_identity import ReportedVersion, describe, mixed_versions, read_reported_version


def _server(version_body: bytes | None, content_type: str = "application/json"):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path == "/version" and version_body is not None:
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(version_body)))
                self.end_headers()
                self.wfile.write(version_body)
            else:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("body, info, want", [
    # vLLM: /version answers; its dev-mode server info has no version key
    (b'{"version": "0.33.0"}', {"vllm_config": {}}, {"/version": "0.33.0"}),
    # SGLang and the demo: server info carries it; /version does not exist
    (None, {"version": "0.5.23", "tp_size": 8}, {"server_info.version": "0.5.23"}),
    # a build that adds its commit; values that are not text are not versions
    (None, {"version": "1.0", "git_commit": "abc123", "commit": {"sha": "x"}, "git_sha": True},
     {"server_info.version": "1.0", "server_info.git_commit": "abc123"}),
    # a /version that is not JSON, and no server info at all: nothing reported
    (b"1.2.3", None, {}),
])
def test_read_reported_version(body, info, want):
    server = _server(body)
    try:
        rep = read_reported_version(f"http://127.0.0.1:{server.server_address[1]}", info)
    finally:
        server.shutdown()
        server.server_close()
    assert dict(rep.values) == want
    assert ReportedVersion.from_dict(json.loads(json.dumps(rep.to_dict()))) == rep


def _boot(boot_id: int, values: dict | None):
    version = ReportedVersion(values).to_dict() if values is not None else None
    return SimpleNamespace(id=boot_id, evidence=BootEvidence(engine_version=version))


def test_mixed_versions_names_values_and_boots():
    same = [_boot(1, {"/version": "1.0"}), _boot(3, {"/version": "1.0"}), _boot(5, None)]
    assert mixed_versions("baseline", same) is None
    assert describe(same) == "1.0 (/version): boots 1, 3"
    silent = [_boot(1, {}), _boot(2, None)]
    assert mixed_versions("baseline", silent) is None and describe(silent) == ""
    mixed = [_boot(1, {"/version": "1.0"}), _boot(3, {"/version": "2.0"}), _boot(5, {"/version": "2.0"})]
    found = mixed_versions("treatment", mixed)
    assert found.kind is FindingKind.ENGINE_VERSIONS and found.side == "treatment" and found.boots == (1, 3, 5)
    assert found.figures == {"versions": {"1.0 (/version)": [1], "2.0 (/version)": [3, 5]}}
    assert found.text == ("engine version: treatment boots report different code (1.0 (/version) in boot 1; "
                          "2.0 (/version) in boots 3, 5): this config did not run one build; give each commit its "
                          "own environment (engine.environment: venv) and check the build")

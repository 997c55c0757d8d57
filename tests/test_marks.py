"""Marks that discriminate, through the real ``harness run`` on ``marks_engine.py``: a
server's steady off-by-one between its chunks and its token count is learnt and said
once, not a ``usage_mismatch``; the sockets a collective library opens for its own
bootstrap are told apart from a server port reachable from the network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bisect_harness.observe.provenance import ListeningReport, ListeningSocket
from helpers import query, run_inert_pair

ENGINE = Path(__file__).parent / "marks_engine.py"


def _run(tmp_path: Path, mode: str, requests: int = 2):
    proc, db = run_inert_pair(tmp_path, ENGINE, mode, samples_per_boot=2,
                              benchmark={"prompt_tokens": 4, "output_tokens": 8, "requests_per_sample": requests,
                                         "warmup_requests": 0, "ignore_eos": False})
    assert proc.returncode == 0, proc.stderr[-3000:]
    boots = [(s, json.loads(m), json.loads(p), port) for s, m, p, port in
             query(db, "SELECT status, marks, provenance, port FROM boots")]
    assert len(boots) == 4 and all(s == "ok" for s, *_ in boots), boots
    return boots, next((tmp_path / "exp").glob("*.md")).read_text()


@pytest.mark.slow
def test_one_chunk_more_than_the_counted_tokens_on_every_request_is_learnt_not_marked(tmp_path):
    boots, journal = _run(tmp_path, "extra-chunk")
    for _, marks, prov, _ in boots:
        assert "usage_mismatch" not in marks and "usage_mismatch" not in prov, (marks, prov)
        offset = prov["usage_offset"]
        assert offset["extra_chunks"] == 1 and offset["requests"] == 4
        assert "the server counted 8 output tokens for 9 chunks of text" in offset["note"]
    assert journal.count("token count: the server sent 1 chunk of text more than the tokens it counted on every "
                         "one of the boot's 4 requests") == 4


@pytest.mark.slow
def test_an_extra_chunk_on_some_requests_only_is_still_a_usage_mismatch(tmp_path):
    boots, _ = _run(tmp_path, "extra-chunk-sometimes")
    for _, marks, prov, _ in boots:
        assert "usage_mismatch" in marks and "usage_offset" not in prov, (marks, prov)
        assert prov["usage_mismatch"]["requests"] == 2


@pytest.mark.slow
def test_a_bootstrap_socket_beyond_loopback_is_a_fact_and_not_the_mark(tmp_path):
    boots, journal = _run(tmp_path, "bootstrap-wide")
    for _, marks, prov, port in boots:
        listening = prov["listening"]
        assert "listens_beyond_loopback" not in marks and listening["beyond_loopback"] == [], listening
        (own,) = listening["collective"]
        assert own.startswith("0.0.0.0:") and "connected to by pid" in own, own
        assert listening["server_ports"] == [port]
    assert journal.count("listening beyond loopback for the server's own processes") == 4


@pytest.mark.slow
def test_a_server_whose_http_port_listens_beyond_loopback_is_marked(tmp_path):
    boots, _ = _run(tmp_path, "http-wide")
    for _, marks, prov, port in boots:
        assert "listens_beyond_loopback" in marks
        (wide,) = prov["listening"]["beyond_loopback"]
        assert wide.startswith(f"0.0.0.0:{port} (python") and prov["listening"]["collective"] == []


def test_nccls_own_sockets_on_the_hosts_address_are_told_from_a_server_port():
    """An 8-GPU engine's figures (NCCL binds the interface it picked; its proxy and RAS
    sockets have no peer connected at the moment they are read): the sockets in a process
    that has libnccl loaded, on the host's own address, are NCCL's; the HTTP port and an
    exporter on every address are the server's, whatever is loaded."""
    nccl = ("libnccl.so.2",)
    report = ListeningReport((
        ListeningSocket(101, "python3", "0.0.0.0", 30000, libraries=nccl),          # the HTTP port
        ListeningSocket(101, "python3", "127.0.0.1", 29500, peers=(102, 103)),     # the store, on loopback
        ListeningSocket(102, "python3", "10.1.2.3", 41231, libraries=nccl),        # NCCL bootstrap
        ListeningSocket(102, "python3", "10.1.2.3", 41232, libraries=nccl),        # NCCL proxy
        ListeningSocket(103, "python3", "10.1.2.3", 45117, peers=(102,), libraries=nccl),
        ListeningSocket(104, "python3", "0.0.0.0", 9400, libraries=nccl),          # an exporter
        ListeningSocket(105, "python3", "10.1.2.3", 8081),                         # no library, no peer
    ), server_ports=(30000,))
    assert [s.port for s in report.collective] == [41231, 41232, 45117]
    assert [s.port for s in report.beyond_loopback] == [30000, 9400, 8081]
    said = report.to_dict()
    assert said["collective"][2] == "10.1.2.3:45117 (python3, pid 103) [connected to by pid 102; libnccl.so.2 loaded]"
    assert ListeningReport((ListeningSocket(1, "x", "10.1.2.3", 5, libraries=nccl),)).beyond_loopback == ()

"""Bodies read within bounds from real loopback servers that compress anyway."""

from __future__ import annotations

import gzip
import threading
import tracemalloc
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from bisect_harness.measure.deadline import deadline_client
from bisect_harness.measure.bodies import MAX_BODY_BYTES, BodyTooLarge, UnreadableBody, bounded_get, decoded, read_some
from hostile_engine import gzip_bomb

BOMB = gzip_bomb(256)  # 256 MiB of newlines in about 260 KB


class Serve:
    """One loopback server answering every GET with ``body`` and ``headers``."""

    def __init__(self, body: bytes, headers: dict, status: int = 200):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(status)
                for k, v in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:  # the reader stopped
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/x"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_a_gzip_bomb_costs_the_cap_not_its_decoded_size():
    # httpx's own decoder inflates each received chunk whole: 64 KiB of this bomb is 64 MiB
    with Serve(BOMB, {"Content-Encoding": "gzip"}) as srv, deadline_client() as http:
        tracemalloc.start()
        try:
            with pytest.raises(BodyTooLarge, match="went past 4,194,304 bytes"):
                bounded_get(http, srv.url, 20.0)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 3 * MAX_BODY_BYTES, f"peak {peak:,} bytes while reading a capped body"


def test_pieces_are_never_larger_than_asked_and_decode_to_the_whole():
    with Serve(BOMB, {"Content-Encoding": "gzip"}) as srv, deadline_client() as http:
        with http.stream("GET", srv.url) as resp:
            sizes = [len(p) for p in decoded(resp, 1 << 20)]
    assert max(sizes) <= 1 << 20 and sum(sizes) == 256 << 20


@pytest.mark.parametrize("encoding,body", [
    ("deflate", zlib.compress(b"hostile_tokens_total 3\n")),               # the RFC's zlib stream
    ("deflate", zlib.compress(b"hostile_tokens_total 3\n", wbits=-15)),  # raw, as some servers send
    ("x-gzip", gzip.compress(b"hostile_tokens_total 3\n")),
    ("identity", b"hostile_tokens_total 3\n"),
], ids=["deflate-zlib", "deflate-raw", "x-gzip", "identity"])  # gzip's header holds the time: ids by name
def test_each_encoding_a_server_may_send_is_decoded(encoding, body):
    with Serve(body, {"Content-Encoding": encoding}) as srv, deadline_client() as http:
        got = bounded_get(http, srv.url, 10.0)
    assert got.content == b"hostile_tokens_total 3\n"


def test_an_encoding_the_harness_does_not_decode_is_named():
    with Serve(b"\x00" * 64, {"Content-Encoding": "br"}) as srv, deadline_client() as http:
        with pytest.raises(UnreadableBody, match="'br'-encoded although the harness asked for none"):
            bounded_get(http, srv.url, 10.0)


def test_a_huge_error_page_is_read_only_as_far_as_it_is_quoted():
    page = b"<html>" + b"x" * (64 << 20)
    with Serve(page, {}, status=500) as srv, deadline_client() as http:
        with http.stream("GET", srv.url) as resp:
            head = read_some(resp, 500)
    assert head == page[:500]

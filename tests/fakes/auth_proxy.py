"""A reverse proxy that adds `Authorization: Bearer <token>` to every request, for a client that cannot send
a header (the MCP conformance suite), in front of `conclave serve --http`, which always needs a token.

    with http_server(tmp_path, env) as url, bearer_proxy(url, HTTP_TOKEN) as proxied: ...

Everything else passes through as it came, Host and Origin included (the server's DNS-rebinding checks
see what the client sent), and responses stream back chunk by chunk (SSE).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import httpx2

_HOP = {
    "connection",
    "content-length",
    "transfer-encoding",
    "keep-alive",
    "authorization",
    "content-encoding",
}


class _Proxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str, token: str) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        self.upstream, self.token = upstream, token


class _Forward(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Proxy

    def log_message(self, format: str, *args: object) -> None:  # the stdlib's name
        pass

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {key: value for key, value in self.headers.items() if key.lower() not in _HOP}
        headers["Authorization"] = f"Bearer {self.server.token}"
        request = httpx2.Request(
            self.command, self.server.upstream + self.path, headers=headers, content=body
        )
        with httpx2.Client(timeout=None) as client:
            response = client.send(request, stream=True)
            try:
                self.send_response(response.status_code)
                for key, value in response.headers.multi_items():
                    if key.lower() not in _HOP:
                        self.send_header(key, value)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for chunk in response.iter_raw():
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            finally:
                response.close()

    do_GET = do_POST = do_DELETE = _forward


@contextmanager
def bearer_proxy(url: str, token: str) -> Iterator[str]:
    """Serve a proxy to `url`'s server that adds the token; yield the same path on the proxy."""
    parts = urlsplit(url)
    proxy = _Proxy(f"{parts.scheme}://{parts.netloc}", token)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}{parts.path}"
    finally:
        proxy.shutdown()
        proxy.server_close()

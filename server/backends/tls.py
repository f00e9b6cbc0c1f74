"""One TLS client context per process, shared by every backend's HTTP client.

Each SDK client builds its own `ssl.SSLContext` by default, and loading the trust store is most of what
building a backend costs: about 15 ms a context, and a Gemini client builds two. Sixteen jobs of three
agents starting at once spent over a second on it, one backend after another (bench/bench_store.py). A
context is safe to share between connections and threads; it holds the trust store and the TLS settings,
no secrets.

It is the context the SDKs build themselves (httpx2's default: the OS trust store, or `SSL_CERT_FILE` /
`SSL_CERT_DIR` when set), made once for each value of those variables.
"""

from __future__ import annotations

import functools
import os
import ssl


def client_context() -> ssl.SSLContext:
    """The shared context for the CA settings in the environment now."""
    return _context(os.environ.get("SSL_CERT_FILE") or None, os.environ.get("SSL_CERT_DIR") or None)


@functools.cache
def _context(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    if cafile or capath:
        return ssl.create_default_context(cafile=cafile, capath=capath)
    import httpx2  # the SDKs' HTTP library (openai, anthropic and google-genai all use it)

    return httpx2.create_ssl_context()

"""The key a member's egress proxy adds never comes back to the member in a response (sandbox/
provider_key.py `KeyScrubber`): not as it is, and not cut in two by the framing of a chunked body
(`Transfer-Encoding: chunked`), where the bytes between the halves are a chunk's size line, which the
member's HTTP client drops as it reads the body. Before: a key split across two chunks passed whole."""

from __future__ import annotations

import anyio
import anyio.abc
import pytest

from conclave.clis.cli_adapter import PLACEHOLDER_KEY
from conclave.sandbox.allowlist import allowlist_for
from conclave.sandbox.egress import egress_proxy
from conclave.sandbox.provider_key import KeyScrubber, ProviderKey
from conclave.sandbox.route import DirectRoute
from tests.test_egress import ask
from tests.test_egress_provider_key import quiet

pytestmark = pytest.mark.anyio
KEY = "sk-real-0123456789-abcdefghij"
MASKED = b"*" * len(KEY)


def chunked(*parts: bytes, head: bytes = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n") -> bytes:
    """A response whose body is sent as these chunks (each with its size line), then the last chunk."""
    return head + b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"


def dechunked(response: bytes) -> bytes:
    """The body a client reads from a chunked response (its framing dropped): the test's own reading."""
    head, _, rest = response.partition(b"\r\n\r\n")
    body = b""
    while True:
        line, _, rest = rest.partition(b"\r\n")
        size = int(line.split(b";")[0], 16)
        if size == 0:
            return head + b"\r\n\r\n" + body
        body, rest = body + rest[:size], rest[size + 2 :]


def scrubbed(response: bytes, cut: int) -> bytes:
    scrubber = KeyScrubber(KEY)
    return scrubber.feed(response[:cut]) + scrubber.feed(response[cut:]) + scrubber.flush()


def test_a_key_split_across_the_chunks_of_a_chunked_body_is_masked_at_every_split() -> None:
    key = KEY.encode()
    for split in range(1, len(key)):
        response = chunked(b'{"error": "bad key ' + key[:split], key[split:] + b'"}', b"more " + key)
        for cut in range(0, len(response) + 1, 7):
            out = scrubbed(response, cut)
            assert len(out) == len(response), (split, cut)  # the framing as it was
            body = dechunked(out)
            assert key not in body and body.count(MASKED) == 2, (split, cut, body)


def test_a_key_split_over_three_chunks_and_a_chunk_extension_is_masked() -> None:
    key = KEY.encode()
    response = chunked(b"a" + key[:5], key[5:6], key[6:] + b"z")
    response = response.replace(b"\r\n1\r\n", b"\r\n1;note=x\r\n", 1)
    out = scrubbed(response, len(response) // 2)
    assert dechunked(out).endswith(b"a" + MASKED + b"z")


def test_one_response_after_another_on_one_connection() -> None:
    key = KEY.encode()
    first = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    second = chunked(key[:9], key[9:])
    out = scrubbed(first + second, 3)
    assert out[: len(first)] == first and key not in dechunked(out[len(first) :])


def test_what_is_not_a_key_passes_at_once() -> None:
    scrubber = KeyScrubber(KEY)
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert scrubber.feed(head) == head
    assert scrubber.feed(b"c\r\nevent: one\n\n\r\n") == b"c\r\nevent: one\n\n\r\n"  # an event, at once


async def test_through_the_proxy_a_key_a_provider_echoes_across_chunks_reaches_the_member_masked() -> None:
    """A provider on 127.0.0.1 quotes the key it got in a chunked body, cut in two by the chunks' framing
    and sent in two writes; the member, through its egress proxy, reads `*`s in its place."""
    key = KEY.encode()
    got: list[bytes] = []

    async def provider(stream: anyio.abc.ByteStream) -> None:
        async with stream:
            head = b""
            while b"\r\n\r\n" not in head:
                head += await stream.receive()
            got.append(head)
            await stream.send(b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n")
            first = b"bad key: " + b"x" * 5 + b" at " + key[:11]
            await stream.send(b"%x\r\n%s\r\n" % (len(first), first))
            await anyio.sleep(0.1)  # sleep-ok: the halves of the key reach the proxy apart
            await stream.send(b"%x\r\n%s\r\n0\r\n\r\n" % (len(key) - 11, key[11:]))

    async with anyio.create_task_group() as group:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        group.start_soon(listener.serve, provider)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        url = f"http://127.0.0.1:{port}"
        request = f"POST /v1/messages HTTP/1.1\r\nx-api-key: {PLACEHOLDER_KEY}\r\nContent-Length: 0\r\n\r\n"
        async with egress_proxy(allowlist_for("claude-code", base_url=url), route=DirectRoute()) as proxy:
            proxy.serve_key(ProviderKey(url, KEY, "anthropic"))
            reply = await ask(proxy, request.encode())
            await quiet(proxy)
        group.cancel_scope.cancel()
    assert got and KEY.encode() in got[0]  # the provider had the real key
    body = dechunked(reply[reply.index(b"HTTP/1.1") :])
    assert key not in body and body.endswith(b" at " + MASKED), reply

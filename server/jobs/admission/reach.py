"""Whether a team's own servers answer: a short TCP probe of each custom `base_url` (Ollama, vLLM, a proxy).

A key being set says nothing about a server on this machine or the LAN being up: `conclave teams`,
list_teams and submit probe every custom endpoint at once, within PROBE_S, and call one that does not
accept a connection "not reachable at URL" instead of ready. The providers'
own APIs are not probed: their reachability is the provider's business, and a probe would cost every
`teams` call a round trip to each.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

import anyio

from conclave.config.models import Team
from conclave.errors import ConfigError

PROBE_S = 1.5  # a local or LAN server answers a connect in milliseconds


def endpoints(teams: Iterable[Team]) -> list[str]:
    """Every custom base_url the teams' agents call, once each, in order."""
    found: dict[str, None] = {}
    for team in teams:
        for agent in team.agents:
            if agent.custom_endpoint and agent.base_url:
                found[agent.base_url] = None
    return list(found)


async def unreachable(urls: Iterable[str], timeout: float = PROBE_S) -> dict[str, str]:
    """URL -> why it did not accept a connection within `timeout`, for those that did not."""
    failed: dict[str, str] = {}

    async def probe(url: str) -> None:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            with anyio.fail_after(timeout):
                stream = await anyio.connect_tcp(host, port)
            await stream.aclose()
        except TimeoutError:
            failed[url] = f"no answer within {timeout:g} s"
        except OSError as exc:
            refused = isinstance(exc, ConnectionRefusedError) or isinstance(
                exc.__cause__, ConnectionRefusedError
            )
            failed[url] = "connection refused" if refused else exc.strerror or str(exc) or type(exc).__name__

    async with anyio.create_task_group() as tg:
        for url in dict.fromkeys(urls):
            tg.start_soon(probe, url)
    return failed


async def check_reachable(team: Team) -> None:
    """Refuse a team whose own server is down: the job would only fail once every agent had retried."""
    down = await unreachable(endpoints([team]))
    if down:
        url, why = next(iter(down.items()))
        raise ConfigError(
            f"team {team.name!r}: its server is not reachable at {url} ({why}); start it (e.g. `ollama "
            "serve`) "
            "or point the team at a running one (OLLAMA_BASE_URL, VLLM_BASE_URL, or base_url in a team file)"
        )

"""Fixtures every test module shares."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from conclave.config.models import SandboxSpec
from conclave.sandbox.clis_image import clis_tag
from conclave.sandbox.engine import engine_status
from conclave.sandbox.image import image_tag
from tests.fakes.server import FakeProviders
from tests.fakes.team import KEY_DESTINATION, KEY_ENV, PROVIDER_KEYS, TRIO, install, voter, write_team
from tests.postgres import Cluster, cluster, missing
from tests.redis import Redis, redis_server
from tests.redis import missing as redis_missing
from tests.session_exit import arm_exit_watchdog

# "postgres": every test's store is a fresh schema of one throwaway PostgreSQL (.ci/suite-postgres.sh)
SUITE_DATABASE = "CONCLAVE_TEST_SUITE_DATABASE"

_EXIT_STATUS = pytest.StashKey[int]()

# Set by the lanes (tests/lanes/): a rerun on another engine keeps only the tests that reach an engine,
# those needing a sandbox image or an engine client; the others cannot tell one engine from another
# (without any engine, 187 of the 189 others passed, and the 2 skipped ask for `docker`).
ENGINE_ONLY = "CONCLAVE_TEST_ENGINE_ONLY"
_ENGINE_FIXTURES = {"docker_image", "clis_image", "docker"}


def reaches_an_engine(item: pytest.Item) -> bool:
    fixtures = set(getattr(item, "fixturenames", ()))
    return bool(fixtures & _ENGINE_FIXTURES)


# A test run once per CLI whose engine-facing part (the member's relay, its proxy on the host) is the same
# for every CLI: a lane keeps the variant `lane_keeps` names. Every CLI still runs on every lane (the CLI
# members' end-to-end tests), and the main run keeps every variant.
LANE_KEEPS = "lane_keeps"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{LANE_KEEPS}(id): on a lane, only the variant whose id is this")


def _on_a_lane(item: pytest.Item) -> bool:
    if not reaches_an_engine(item):
        return False
    marker = item.get_closest_marker(LANE_KEEPS)
    callspec = getattr(item, "callspec", None)
    return marker is None or callspec is None or callspec.id == marker.args[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(ENGINE_ONLY) != "1":
        return
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        (kept if _on_a_lane(item) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


def pytest_unconfigure(config: pytest.Config) -> None:
    """A thread a failed test left blocked never holds the run open after its summary."""
    if _EXIT_STATUS in config.stash:
        arm_exit_watchdog(config.stash[_EXIT_STATUS])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fakes() -> Iterator[FakeProviders]:
    """The fake provider servers on 127.0.0.1, fresh for each test (see tests/fakes/server.py)."""
    with FakeProviders() as running:
        yield running


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Cluster]:
    """A throwaway PostgreSQL for the session (tests/postgres.py); skips, saying why, where none can run."""
    reason = missing()
    if reason is not None:
        pytest.skip(reason)
    with cluster() as running:
        yield running


@pytest.fixture(scope="session")
def redis_session() -> Iterator[Redis]:
    """A throwaway Redis for the session (tests/redis.py); skips, saying why, where none can run."""
    reason = redis_missing()
    if reason is not None:
        pytest.skip(reason)
    with redis_server() as running:
        yield running


@pytest.fixture
def redis(redis_session: Redis) -> Redis:
    """The session's Redis, emptied for this test (the job queue's tests: jobs/queue.py)."""
    redis_session.flush()
    return redis_session


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path | SecretStr]:
    """Where a store test's database is, once per backend: the SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        yield tmp_path / "conclave.db"
        return
    running: Cluster = request.getfixturevalue("postgres_cluster")
    with running.schema() as url:
        yield url


@pytest.fixture(autouse=True)
def fake_key_destination(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fakes' key may go to the fakes: the suite's team files lie in test folders, not the user's."""
    monkeypatch.setenv("CONCLAVE_KEY_DESTINATIONS", KEY_DESTINATION)


@pytest.fixture(autouse=True)
def suite_database(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """With CONCLAVE_TEST_SUITE_DATABASE=postgres, every test's settings name a fresh PostgreSQL schema."""
    if os.environ.get(SUITE_DATABASE) != "postgres":
        yield
        return
    running: Cluster = request.getfixturevalue("postgres_cluster")
    with running.schema() as url:
        monkeypatch.setenv("CONCLAVE_DATABASE_URL", url.get_secret_value())
        yield


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """For the CLI's tests: state under tmp_path/state, user teams under tmp_path/conclave/teams (XDG), and
    no Conclave setting or provider key from the real environment (but the suite's database, when it runs
    on PostgreSQL); returns tmp_path."""
    keep = {"CONCLAVE_KEY_DESTINATIONS"}
    if os.environ.get(SUITE_DATABASE) == "postgres":
        keep.add("CONCLAVE_DATABASE_URL")
    for name in list(os.environ):
        if name in keep:
            continue
        if name.startswith(("CONCLAVE_", "OLLAMA_", "VLLM_")) or name in PROVIDER_KEYS:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CONCLAVE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
def trio(tmp_path: Path, fakes: FakeProviders, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A team file of three fake agents (one per wire format) that answer once and then vote."""
    install(fakes.script, TRIO, voter())
    monkeypatch.setenv(KEY_ENV, "test-key")
    return write_team(tmp_path / "trio.yaml", fakes, TRIO)


@pytest.fixture(scope="session")
def docker_image() -> str:
    """The sandbox image's tag; a test that needs Docker skips, saying why, where no engine runs."""
    tag = image_tag(SandboxSpec())
    status = engine_status(tag)
    if not status.available or not status.image_present:
        pytest.skip(f"needs the Docker engine and the sandbox image ({status.error}); .ci/run provides both")
    return tag


@pytest.fixture(scope="session")
def clis_image() -> str:
    """The CLI image's tag (`conclave sandbox build --clis`); skips, saying why, without it."""
    tag = clis_tag()
    status = engine_status(tag)
    if not status.available or not status.image_present:
        pytest.skip(
            f"needs the Docker engine and the CLI image {tag} ({status.error}): `conclave sandbox build "
            "--clis`"
        )
    return tag

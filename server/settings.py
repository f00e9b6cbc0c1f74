"""Server settings, resolved once from CONCLAVE_* environment variables and passed down."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

# Every MCP call returns within this many seconds: clients' time limits are short (Codex: 60 s a call).
MAX_WAIT_S = 50


def default_home() -> Path:
    """$XDG_STATE_HOME/conclave, else ~/.local/state/conclave."""
    state = os.environ.get("XDG_STATE_HOME")
    return (Path(state) if state else Path.home() / ".local" / "state") / "conclave"


class Settings(BaseSettings):
    """Where state lives and how much runs at once."""

    model_config = SettingsConfigDict(env_prefix="CONCLAVE_", frozen=True, extra="ignore")

    home: Path = Field(default_factory=default_home, description="state directory: conclave.db and jobs/")
    # The job store in PostgreSQL (postgresql://USER:PASSWORD@HOST:PORT/DATABASE, the `postgres` extra), for
    # fronts and workers on several hosts; unset: the SQLite file under home (jobs/store/connections.py).
    database_url: SecretStr | None = None
    # Where jobs' files are (snapshots, the final tree, the diff): home/jobs unless set. Hosts that share
    # one database share this folder too, each mounting it wherever it likes (docs/deploy.md).
    jobs_dir: Path | None = None
    # The job queue on Redis (redis://HOST:PORT/DB, rediss://..., unix:///path.sock; the `queue` extra):
    # `conclave serve` fronts queue the jobs they admit and `conclave worker` processes run them
    # (jobs/queue.py, docs/deploy.md); unset: this process runs its own jobs, as one machine does.
    queue_url: SecretStr | None = None
    # A queue URL that gives no password is refused by fronts and workers (whoever reaches the Redis
    # could queue work for them) unless the operator says only they can reach it: a private socket or
    # network (jobs/queue.py, docs/deploy.md).
    queue_private: bool = False
    # Jobs running at once. A job mostly waits on its providers, so many fit on a small machine; what
    # bounds the load is provider_concurrency (requests in flight per provider, shared by every job),
    # verify_concurrency (check containers) and max_queued (bench/bench_store.py measures 16 at once).
    max_jobs: Annotated[int, Field(ge=1, le=64)] = 16
    provider_concurrency: Annotated[int, Field(ge=1, le=1024)] = 64
    http_token: SecretStr | None = None
    max_task_chars: Annotated[int, Field(ge=1)] = 100_000
    heartbeat_s: Annotated[float, Field(gt=0)] = 5.0
    # a job's lease: its owner renews it every heartbeat_s; when it runs out (or the owner's process is
    # gone) another server takes the job over and resumes it (jobs/upkeep/takeover.py)
    stale_after_s: Annotated[float, Field(gt=0)] = 15.0
    # Who may name what (jobs/admission/access.py). Folders callers may give as context_paths, separated like
    # PATH (`:`); unset: any folder over stdio, none over HTTP (the working directory is no root). Never the
    # server's own state, whatever the roots (files/kept.py).
    allowed_roots: Annotated[tuple[Path, ...] | None, NoDecode] = None
    # Folders whose team files MCP callers may name by path, beside the presets and the user's team folder
    # (`:`-separated). A project's own folder is not among them unless listed: its files may be a stranger's.
    team_dirs: Annotated[tuple[Path, ...] | None, NoDecode] = None
    sandbox_network: bool = False  # allow teams whose sandbox asks for `network: bridge`
    # Hosts every coding-agent CLI member may reach besides its provider's, comma-separated
    # (`llm.internal:8443,*.example.com`; sandbox/allowlist.py)
    egress_allow: Annotated[tuple[str, ...], NoDecode] = ()
    # A CA (PEM file) that coding-agent CLI members' egress trusts besides the system's roots, e.g. a
    # TLS-inspecting corporate proxy's: their egress proxies and containers add it (sandbox/route.py).
    egress_ca: Path | None = None
    # Where a team file not in the user's team folder (a repository's, one named by path) may send a
    # variable as its key, comma-separated VARIABLE=host[:port|:*] (`MY_PROXY_KEY=llm.internal:8443`);
    # unset: nowhere but each provider's own endpoint (config/destinations.py).
    key_destinations: Annotated[tuple[str, ...], NoDecode] = ()
    # Ceilings no job exceeds, whatever its team or its caller asks (jobs/admission/team_shape.py): tokens
    # (in and out) a job, tokens a member, US dollars a job. A caller may lower a team's limits, never raise
    # them.
    max_job_tokens: Annotated[int, Field(ge=1, le=10**10)] | None = None
    max_member_tokens: Annotated[int, Field(ge=1, le=10**10)] | None = None
    max_job_cost_usd: Annotated[float, Field(gt=0, le=10_000)] | None = None
    # Bounds: jobs waiting for a slot, and the bytes one job's agents' workspaces may hold together.
    max_queued: Annotated[int, Field(ge=0, le=10_000)] = 16
    # Fair share between callers (jobs/run/fair_share.py): one caller's jobs running at once and waiting in
    # its own line. A caller with fewer jobs waiting than the longest line is admitted past max_queued, so
    # one caller's burst never refuses another's job; the defaults leave one user's limits as they were.
    max_jobs_per_caller: Annotated[int, Field(ge=1, le=64)] = 16
    max_queued_per_caller: Annotated[int, Field(ge=0, le=10_000)] = 16
    job_disk_mb: Annotated[int, Field(ge=1)] = 2048
    # Verification (ask_team's `verify`): checks running at once on this server, each one's time limit.
    verify_concurrency: Annotated[int, Field(ge=1, le=64)] = 2
    verify_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 120.0
    # Check containers kept started ahead of jobs, per sandbox spec (coordination/check_pool.py); 0: none,
    # unset: as many as checks may run at once (verify_concurrency), so a job's first checks all find one.
    check_pool: Annotated[int, Field(ge=0, le=64)] | None = None
    # Pruning finished jobs (`conclave gc`, and at server start when gc_auto): older than gc_keep_days,
    # then the oldest while all jobs hold more than gc_max_mb.
    gc_auto: bool = True
    gc_keep_days: Annotated[float, Field(gt=0)] = 30.0
    gc_max_mb: Annotated[int, Field(ge=1)] = 20_000

    @field_validator("egress_allow", "key_destinations", mode="before")
    @classmethod
    def _host_list(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("egress_allow")
    @classmethod
    def _host_rules(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from conclave.config.hosts import parse_host_rule

        for host in value:
            parse_host_rule(host)  # its ValueError names the entry and the shape to write
        return value

    @field_validator("key_destinations")
    @classmethod
    def _key_destinations(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from conclave.config.destinations import parse_key_destination

        for entry in value:
            parse_key_destination(entry)  # its ValueError names the entry and the shape to write
        return value

    @field_validator("database_url", "queue_url")
    @classmethod
    def _blank_url(cls, value: SecretStr | None) -> SecretStr | None:
        """Blank is unset; the URL itself is checked where the store opens it (jobs/store/postgres.py), so
        no error message here shows its password."""
        if value is None or not value.get_secret_value().strip():
            return None
        return SecretStr(value.get_secret_value().strip())

    @field_validator("allowed_roots", "team_dirs", mode="before")
    @classmethod
    def _path_list(cls, value: object) -> object:
        if isinstance(value, str):
            roots = tuple(Path(part).expanduser() for part in value.split(os.pathsep) if part.strip())
            return roots or None
        return value

    @property
    def db_path(self) -> Path:
        return self.home / "conclave.db"

    @property
    def jobs_root(self) -> Path:
        """The folder of every job's files: CONCLAVE_JOBS_DIR, else home/jobs."""
        return self.jobs_dir if self.jobs_dir is not None else self.home / "jobs"

    @property
    def database(self) -> Path | SecretStr:
        """Where the job store is: the PostgreSQL URL when one is set, else the SQLite file under home."""
        return self.database_url if self.database_url is not None else self.db_path


def setting_variables() -> tuple[str, ...]:
    """The CONCLAVE_* variable of every setting a stdio server reads (the HTTP token is for HTTP only),
    for clients that start MCP servers with a short list of variables (cli/install.py)."""
    prefix = Settings.model_config.get("env_prefix", "")
    return tuple(f"{prefix}{name}".upper() for name in Settings.model_fields if name != "http_token")

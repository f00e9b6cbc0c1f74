"""Server settings, resolved once from CONCLAVE_* environment variables and passed down."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

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
    max_jobs: Annotated[int, Field(ge=1, le=64)] = 2
    http_token: SecretStr | None = None
    max_task_chars: Annotated[int, Field(ge=1)] = 100_000
    heartbeat_s: Annotated[float, Field(gt=0)] = 5.0
    stale_after_s: Annotated[float, Field(gt=0)] = 30.0

    @property
    def db_path(self) -> Path:
        return self.home / "conclave.db"

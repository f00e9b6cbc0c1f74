"""Every error Conclave raises on purpose, each message saying what to do next.

    ConclaveError
    ├── InputError            a caller's argument is wrong (names the field, the value, the fix)
    │   └── JobNotFound       no job with that id in the store
    ├── ConfigError           a team file or preset is wrong (names the file, the key, the fix)
    │   ├── TeamNotFound      no preset or file by that name
    │   └── MissingApiKey     a provider key is not in the environment
    ├── ProviderError         a model provider failed; the orchestrator catches these, never SDK classes
    │   ├── RateLimited       429: retried, honouring retry_after
    │   ├── ProviderUnavailable  5xx, timeouts, dropped connections, cut streams: retried
    │   ├── AuthFailed        401/403: fails at once
    │   ├── BadRequest        other 4xx: fails at once with the provider's message
    │   └── MalformedResponse the provider answered something we cannot read: retried
    └── JobError              a job could not run to an answer

`app.py` translates these into MCP tool errors in one place; anything else is a bug.
"""

from __future__ import annotations


class ConclaveError(Exception):
    """Base of every deliberate Conclave error."""


class InputError(ConclaveError):
    """A caller's argument is wrong."""

    def __init__(self, field: str, value: object, fix: str) -> None:
        self.field, self.value, self.fix = field, value, fix
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"{field}={shown} is not valid: {fix}")


class JobNotFound(InputError):
    """No job with that id exists in the store."""

    def __init__(self, job_id: str) -> None:
        super().__init__("job_id", job_id, "no such job; list recent jobs with `conclave status`")


class ConfigError(ConclaveError):
    """A team file or preset is wrong."""


class TeamNotFound(ConfigError):
    """No preset or file by that name."""


class MissingApiKey(ConfigError):
    """A provider key is not set in the environment."""

    def __init__(self, variable: str, model: str) -> None:
        self.variable = variable
        super().__init__(
            f"{model} needs an API key: set the {variable} environment variable "
            f"(or pick another team, e.g. team='local')"
        )


class ProviderError(ConclaveError):
    """A model provider call failed."""

    retryable = False

    def __init__(self, provider: str, message: str, *, status: int | None = None) -> None:
        self.provider, self.status = provider, status
        where = f"{provider} (HTTP {status})" if status else provider
        super().__init__(f"{where}: {message}")


class RateLimited(ProviderError):
    """The provider asked us to slow down (429)."""

    retryable = True

    def __init__(
        self, provider: str, message: str, *, status: int | None = 429, retry_after: float | None = None
    ) -> None:
        super().__init__(provider, message, status=status)
        self.retry_after = retry_after


class ProviderUnavailable(ProviderError):
    """5xx, a timeout, a dropped connection or a cut stream."""

    retryable = True


class AuthFailed(ProviderError):
    """The provider refused the key (401/403)."""


class BadRequest(ProviderError):
    """The provider refused the request (a 4xx other than 401/403/429)."""


class MalformedResponse(ProviderError):
    """The provider answered with something we could not parse."""

    retryable = True


class JobError(ConclaveError):
    """A job could not run to an answer."""

"""Team configuration.

The models (models.py), reading team files (loading.py), where teams come from (presets.py).
"""

from conclave.config.loading import expand_env, load_team_file, parse_team
from conclave.config.models import (
    EXPANDABLE,
    KEY_VARIABLES,
    LABEL,
    LETTER,
    MAX_AGENTS,
    MAX_ANSWERS,
    OFFICIAL_HOSTS,
    PROVIDERS,
    AgentSpec,
    Coordination,
    Price,
    Sandbox,
    Team,
    memory_bytes,
)
from conclave.config.presets import (
    DEFAULT_ORDER,
    FALLBACK_TEAM,
    configs_dir,
    list_presets,
    package_dir,
    preset_paths,
    resolve_team,
    user_teams_dir,
)
from conclave.errors import ConfigError

__all__ = [
    "DEFAULT_ORDER", "EXPANDABLE", "FALLBACK_TEAM", "KEY_VARIABLES", "LABEL", "LETTER", "MAX_AGENTS",
    "MAX_ANSWERS", "OFFICIAL_HOSTS", "PROVIDERS", "AgentSpec", "ConfigError", "Coordination", "Price",
    "Sandbox", "Team", "configs_dir", "expand_env", "list_presets", "load_team_file", "memory_bytes",
    "package_dir", "parse_team", "preset_paths", "resolve_team", "user_teams_dir",
]

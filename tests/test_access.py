"""Who may name what, per transport (jobs/admission/access.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conclave.errors import NotPermitted
from conclave.jobs.admission.access import Access
from conclave.settings import Settings


@pytest.fixture
def places(tmp_path: Path) -> dict[str, Path]:
    names = ("project", "config/conclave/teams", "elsewhere")
    found = {name.split("/")[0]: tmp_path / name for name in names}
    for folder in found.values():
        folder.mkdir(parents=True)
    for folder in (found["project"], found["config"], found["elsewhere"]):
        (folder / "team.yaml").write_text("agents: []\n")
    (found["project"] / "out").symlink_to(found["elsewhere"])
    return found


def test_mcp_reads_team_files_from_the_presets_the_users_folder_and_listed_folders(
    places: dict[str, Path], tmp_path: Path
) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    stdio = Access.stdio(Settings(home=tmp_path / "h"), env, places["project"])
    http = Access.http(Settings(home=tmp_path / "h"), env, places["project"])
    for access in (stdio, http):
        with pytest.raises(NotPermitted, match="CONCLAVE_TEAM_DIRS"):  # the project is not trusted by default
            access.check_team(str(places["project"] / "team.yaml"))
        listed = Settings(home=tmp_path / "h", team_dirs=f"{tmp_path / 'nowhere'}:{places['project']}")
        Access.stdio(listed, env, places["project"]).check_team(str(places["project"] / "team.yaml"))
    for access in (stdio, http):
        access.check_team(str(places["config"] / "team.yaml"))
        access.check_team("frontier")  # a preset name is never a path
        with pytest.raises(NotPermitted, match="team file is read only from"):
            access.check_team(str(places["elsewhere"] / "team.yaml"))
        with pytest.raises(NotPermitted):
            access.check_team(str(places["project"] / "out" / "team.yaml"))  # a link out of the folder
    Access.local(Settings(home=tmp_path / "h")).check_team(str(places["elsewhere"] / "team.yaml"))


def test_allowed_roots_bound_every_transport_and_over_http_are_only_the_operators(
    places: dict[str, Path], tmp_path: Path
) -> None:
    open_settings = Settings(home=tmp_path / "h")
    Access.stdio(open_settings, {}, places["project"]).check_folder("p", str(places["elsewhere"]))
    unset = Access.http(open_settings, {}, places["project"])  # the working directory is no root
    with pytest.raises(
        NotPermitted, match="this server has none: its operator can set CONCLAVE_ALLOWED_ROOTS"
    ):
        unset.check_folder("p", str(places["project"]))
    http = Access.http(Settings(home=tmp_path / "h", allowed_roots=str(places["project"])), {}, tmp_path)
    http.check_folder("p", str(places["project"]))
    for outside in (places["elsewhere"], places["project"] / "out", places["project"] / ".."):
        with pytest.raises(NotPermitted, match="CONCLAVE_ALLOWED_ROOTS"):
            http.check_folder("p", str(outside))
    rooted = Settings(home=tmp_path / "h", allowed_roots=f"{places['elsewhere']}")
    Access.local(rooted).check_folder("p", str(places["elsewhere"]))
    with pytest.raises(NotPermitted):
        Access.local(rooted).check_folder("p", str(places["project"]))

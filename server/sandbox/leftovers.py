"""What a command leaves running in its container: seen from the host when it can be, reaped by an exec.

After every command sandbox/container.py makes sure no process of the command's user is left (a `&`
child, a `setsid` escapee, a fork loop). The reaping is a second exec (`REAP`, tens of milliseconds of
engine calls), so it is skipped when the host can show that nothing is left (`nothing_left`):
- the container's pids cgroup counts every task in it in one number, `pids.current`, which the kernel
  changes atomically at each fork and at each release (threads, forks in flight and unreaped zombies
  all count);
- read that count first, then list the cgroup's tasks: nothing is left when the list is exactly as long
  as the count and every task in it runs as the container's keeper (the uid of the container's PID 1:
  `keeper_user` in container.py, which the command's user can never be).
The keeper (docker-init and its `sleep`) forks nothing after the start, so a task of the command's
alive when the count was read would make the count one more than the keepers listed. Anything else (a
task of another uid, a count the list does not match, a task gone before its owner was read, a host
that cannot see the cgroup: a remote or rootless engine, another cgroup namespace) answers False, and
the reaping exec runs as before: the exec is skipped only when nothing is left.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Where a container's cgroup with the pids controller lies on the host: v1 then v2, cgroupfs then systemd.
CGROUPS = (
    "/sys/fs/cgroup/pids/docker/{id}",
    "/sys/fs/cgroup/pids/system.slice/docker-{id}.scope",
    "/sys/fs/cgroup/docker/{id}",
    "/sys/fs/cgroup/system.slice/docker-{id}.scope",
)
# Run as the command's user after a command: kill every process of that user but this shell (kill -1
# spares the caller, PID 1 and other users' processes), then make sure none is left but zombies. A task
# killed in the middle of a write to a folder shared through FUSE (a VM engine's file sharing) takes a
# moment to go, so after ten quick passes it waits between them: about 2 s in all, as the runner's reap.
REAP = r"""me=$$; i=0
while [ $i -lt 100 ]; do
  kill -KILL -1 2>/dev/null; left=
  for d in /proc/[0-9]*; do
    [ "${d#/proc/}" = "$me" ] && continue
    [ -O "$d" ] || continue
    read -r s < "$d/stat" 2>/dev/null || continue
    case "$s" in *") Z "*) continue;; esac
    left=1; break
  done
  [ -z "$left" ] && exit 0
  i=$((i+1)); [ $i -gt 10 ] && sleep 0.02
done
exit 1"""


def cgroup_of(container_id: str) -> Path | None:
    """The container's pids cgroup folder as this host sees it, or None."""
    for pattern in CGROUPS:
        folder = Path(pattern.format(id=container_id))
        if (folder / "pids.current").is_file():
            return folder
    return None


def nothing_left(cgroup: Path) -> bool:
    """True only when every task in the cgroup is the keeper's (see the module docstring); blocking, a
    few reads of kernel files."""
    try:
        count = int((cgroup / "pids.current").read_text())
        listing = cgroup / "tasks" if (cgroup / "tasks").is_file() else cgroup / "cgroup.threads"
        tasks = [int(line) for line in listing.read_text().split()]
        owners = [_status(task) for task in tasks]
    except (OSError, ValueError):
        return False
    keepers = {uid for uid, pid in owners if pid == 1}
    return len(tasks) == count and len(keepers) == 1 and all(uid in keepers for uid, _ in owners)


def _status(task: int) -> tuple[int, int]:
    """A task's real uid and its pid inside the container (the last NSpid field), from /proc."""
    uid = pid = -1
    for line in Path(f"/proc/{task}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[1])
        elif line.startswith("NSpid:"):
            pid = int(line.split()[-1])
    return uid, pid


def reap(api: Any, container_id: str, user: str) -> bool:
    """Kill every process of `user` in the container by an exec of REAP; False if any stays (or the
    exec failed): the caller then restarts the container."""
    import docker

    try:
        exec_id = api.exec_create(container_id, ["sh", "-c", REAP], user=user)
        api.exec_start(exec_id["Id"])
        return bool(api.exec_inspect(exec_id["Id"]).get("ExitCode") == 0)
    except docker.errors.APIError:
        return False

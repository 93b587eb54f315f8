"""Who this executor is, and whether another one on this host is still alive.

On one host a dead owner is detected at once, without waiting for its lease:
its pid is gone, or the pid now belongs to a process that started at another
time (pid reuse), read from /proc where it exists. Only within one pid
namespace: a container that shares the host's name (host networking) numbers
its processes apart, so its pids are never read here (``pid_start`` names the
namespace beside the start time).
"""

from __future__ import annotations

import os
import socket
import uuid

from durably import journal


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name ([] where unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[-1].split()
    except OSError:
        return []


def process_start(pid: int) -> str:
    """An opaque token for when the process started ('' where /proc is missing)."""
    fields = _stat(pid)
    return fields[19] if len(fields) > 19 else ""  # field 22 of stat: starttime


def _pid_namespace() -> str:
    """This process's pid namespace ('' where /proc does not say), e.g. ``pid:[4026531836]``."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def this_executor(now: float, executor_id: str | None = None) -> journal.ExecutorInfo:
    """The identity a new executor registers with."""
    pid = os.getpid()
    start, namespace = process_start(pid), _pid_namespace()
    return journal.ExecutorInfo(
        executor_id=executor_id or f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:8]}",
        host=socket.gethostname(),
        pid=pid,
        pid_start=f"{start}@{namespace}" if namespace else start,
        started_at=now,
        heartbeat_at=now,
    )


def is_dead_here(other: journal.ExecutorInfo) -> bool:
    """True when ``other`` ran on this host, in this pid namespace, and its process is gone.

    One of another namespace (or of a durably that did not record its namespace) is
    left to its lease: its pid may name any process here, this one included.
    """
    if other.host != socket.gethostname():
        return False
    pid_start, _, namespace = other.pid_start.partition("@")
    if namespace != _pid_namespace():
        return False
    if other.pid == os.getpid():
        return pid_start != process_start(other.pid)
    try:
        os.kill(other.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, owned by someone else
    fields = _stat(other.pid)
    if fields and fields[0] in ("Z", "X"):
        return True  # killed, not yet reaped by its parent
    start = fields[19] if len(fields) > 19 else ""
    return bool(start and pid_start and start != pid_start)

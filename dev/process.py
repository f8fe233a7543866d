"""Process and port helpers shared by the dev services: free loopback ports, waiting, stopping by PID.

Everything here works on PIDs this code started itself; nothing looks processes up by name.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

LOOPBACK = "127.0.0.1"
# Ports picked at random come from below Linux's ephemeral range (32768+), where outgoing client
# connections take their local ports and could grab a port between picking and binding it, and
# avoid the fixed ports of dev/services (18xxx/19xxx and their +10000 gRPC partners).
PICK_RANGE = (10000, 32767)
RESERVED_RANGES = ((18000, 19999), (28000, 29999))

T = TypeVar("T")


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """True when nothing listens on host:port and it can be bound right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR matches what servers set, so a port in TIME_WAIT still counts as free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_is_open(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_ports(count: int, *, offset: int | None = None, avoid: Iterable[int] = ()) -> list[int]:
    """Pick `count` distinct free loopback ports.

    With `offset`, port + offset must be free too: SeaweedFS derives gRPC ports that way in places
    where its flags do not reach, so both halves of each pair have to be available.
    """
    taken = set(avoid)
    chosen: list[int] = []
    rng = random.Random()
    for _ in range(5000):
        if len(chosen) == count:
            return chosen
        port = rng.randint(PICK_RANGE[0], PICK_RANGE[1] - (offset or 0))
        candidates = [port] if offset is None else [port, port + offset]
        if any(p in taken or _reserved(p) for p in candidates) or not all(map(port_is_free, candidates)):
            continue
        chosen.append(port)
        taken.update(candidates)
    raise RuntimeError(f"could not find {count} free loopback ports (offset={offset})")


def _reserved(port: int) -> bool:
    return any(low <= port <= high for low, high in RESERVED_RANGES)


def wait_until(
    condition: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.2,
    description: str = "condition",
    fatal: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll `condition` until it returns something truthy and return that; raise TimeoutError
    naming `description` after `timeout` seconds. Exceptions from `condition` count as "not yet"
    (the last one is chained onto the TimeoutError, so a failure says why it never got there),
    except those in `fatal`, which propagate at once: waiting cannot fix them."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = condition()
            if result:
                return result
        except fatal:
            raise
        except Exception as exc:  # a service still starting fails in many ways; keep polling
            last_error = exc
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {description}") from last_error
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """True when a process with this PID exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            # The state letter follows the parenthesised command name, which may contain spaces.
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def pid_cmdline(pid: int) -> list[str]:
    """The command line of a live process, or [] when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def pid_matches(pid: int, marker: str) -> bool:
    """True when `pid` is alive and its command line contains `marker`.

    Guards against a recycled PID: a PID file may outlive its process, and the number may since
    belong to something else that must not be signalled.
    """
    return pid_alive(pid) and any(marker in arg for arg in pid_cmdline(pid))


def stop_pid(pid: int, *, timeout: float = 30.0, kill_timeout: float = 10.0) -> bool:
    """Stop one process: SIGTERM, wait up to `timeout`, then SIGKILL. Returns True when it is gone.

    Reaps the process if it is our child, so it does not linger as a zombie.
    """
    if not pid_alive(pid):
        _reap(pid)
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if _wait_gone(pid, timeout):
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return _wait_gone(pid, kill_timeout)


def stop_pids(pids: Iterable[int], *, timeout: float = 30.0) -> None:
    """Stop several processes at once: SIGTERM to all first, then wait for each (SIGKILL on timeout).

    Signalling together matters for a KRaft quorum: stopped one by one, the last nodes lose their
    quorum and hang in controlled shutdown until killed.
    """
    pids = list(pids)
    for pid in pids:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    for pid in pids:
        stop_pid(pid, timeout=timeout)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    _reap(pid)
    return not pid_alive(pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log file, for error messages; empty when the file is missing."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])

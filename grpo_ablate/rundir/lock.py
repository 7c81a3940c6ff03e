"""The run dir's lock: one process writes a run or sweep dir at a time; a lock left by a dead
process is taken over, one held by a live one is a one-line refusal. A cache entry's lock
(BuildLock): one process builds it, the others wait for it, saying so."""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from grpo_ablate.errors import ConfigError

# ------------------------------------------------------------------------------ one writer a dir
LOCK = ".lock"
_HELD: dict[str, list] = {}   # lock path -> [open fd, how often this process holds it] (the CLI, then its trainer)


class DirLock:
    """A run dir or sweep dir is written by one process at a time. The writer holds an OS lock
    (flock) on `.lock` while it works, and writes its pid and host there for the messages; the
    file is removed when it ends. The OS drops the lock when its process ends however it ends,
    so a lock nobody holds is stale whatever the file says (garbage, a recycled pid, pid 1),
    and taking one over cannot race: whoever gets the OS lock on the file at the path owns it.
    A held lock, or a file naming a process on another host (a shared file system), is refused
    in one line. Re-entrant within a process."""

    def __init__(self, directory: Path, what: str, say=None):
        self.directory, self.what, self.say = Path(directory), what, say or (lambda text: None)
        self.path = self.directory / LOCK
        self.me = {"pid": os.getpid(), "host": socket.gethostname()}

    def acquire(self) -> "DirLock":
        key = str(self.path.resolve())
        if key in _HELD:
            _HELD[key][1] += 1
            return self
        moved = 0
        while moved < 5:
            fd = self._open()
            if not self._flock(fd):   # held by a live process
                os.close(fd)
                self._held()          # refused here; a BuildLock waits, then tries again
                continue
            if not self._still_at_path(fd):   # its holder removed it between our open and our lock
                os.close(fd)
                moved += 1
                continue
            left = os.read(fd, 4096).decode(errors="replace").strip()
            self._refuse_other_host(fd, left)
            if left:
                self.say(f"{self.path}: {self._left_by(left)}; taking the {self.what} over")
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps({**self.me, "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n").encode(), 0)
            _HELD[key] = [fd, 1]
            return self
        raise ConfigError(f"could not lock {self.what} {self.directory}: {self.path} keeps changing hands")

    def _flock(self, fd: int) -> bool:
        """Take the OS lock on `fd`: False when a live process holds it."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as err:   # a file system without locks (some NFS mounts): the work goes on, unguarded
            self.say(f"{self.path}: this file system cannot lock files ({err.strerror}); nothing stops a "
                     f"second process from writing this {self.what}")
        return True

    def _held(self) -> None:
        raise ConfigError(self._held_message())

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except IsADirectoryError:
            raise ConfigError(f"{self.path} is a directory, not {self.what}'s lock file; remove it "
                              f"(rmdir {self.path}) and run again") from None
        except OSError as err:
            raise ConfigError(f"cannot lock {self.what} {self.directory}: {self.path}: {err.strerror}") from None

    def _still_at_path(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def _held_message(self) -> str:
        holder = _read_holder(self.path)
        who = f"process {holder[0]}" if holder else "another process"
        return f"{self.what} {self.directory} is in use by {who} on this machine ({self.path}); wait for it to " \
               "finish or stop it"

    def _refuse_other_host(self, fd: int, left: str) -> None:
        holder = _parse_holder(left)
        if holder and holder[1] != self.me["host"]:
            os.close(fd)   # its OS lock may not reach us across machines: that process may still be running
            raise ConfigError(f"{self.what} {self.directory} is in use by process {holder[0]} on {holder[1]} "
                              f"({self.path}); wait for it, or delete that file if that process is gone")

    @staticmethod
    def _left_by(left: str) -> str:
        """Who left a lock nobody holds. Its pid may be alive (pid 1 in a container, a recycled
        pid): that process does not hold the lock, so it is not called gone."""
        holder = _parse_holder(left)
        if not holder:
            return "the process that left it is gone"
        if holder[0] <= 0:   # no process has such a pid (and kill(-1) would ask about every process)
            return f"its process {holder[0]} is gone"
        try:
            os.kill(holder[0], 0)
        except ProcessLookupError:
            return f"its process {holder[0]} is gone"
        except OSError:   # alive, another user's (PermissionError), or a pid the OS refuses
            pass
        return f"its process {holder[0]} no longer holds it (that pid is alive, but does not hold the lock)"

    def release(self) -> None:
        key = str(self.path.resolve())
        if key not in _HELD:
            return
        _HELD[key][1] -= 1
        if _HELD[key][1] == 0:
            fd, _ = _HELD.pop(key)
            self.path.unlink(missing_ok=True)   # while still holding it: a waiting opener finds it gone, retries
            os.close(fd)

    def __enter__(self) -> "DirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class BuildLock(DirLock):
    """One builder per cache entry (the embedded model's warm start, a GGUF file's conversion), across
    processes: the builder holds the OS lock on `.<entry>.lock` beside the entry while it builds; another
    process that wants the same entry says once, in one line, which process it waits for, and waits
    (asleep, trying again every `poll` seconds) until the lock is free, then finds the entry built. A
    killed builder blocks nobody: the OS drops its lock, and the next process takes the lock over (and
    builds, the entry being still missing). A lock held while the file names a process of this host
    that is gone (a child that inherited the descriptor) is broken rather than waited on forever. A
    file naming another host is taken over too: an entry is renamed into place whole, so two builders
    cost time, never a half-written entry."""

    def __init__(self, entry: Path, say=None, poll: float = 1.0):
        super().__init__(Path(entry).parent, "cache entry", say)
        self.entry, self.poll, self.waited, self.suspect = Path(entry), poll, False, None
        self.path = self.entry.parent / f".{self.entry.name}.lock"

    def _held(self) -> None:
        holder = _read_holder(self.path)
        if holder and holder[1] == self.me["host"] and _gone(holder[0]):
            # the lock outlived its builder; seen twice, a poll apart, since a new holder writes its pid
            # into the file only just after it took the lock
            if self.suspect == holder[0]:
                self.say(f"{self.path}: its process {holder[0]} is gone; breaking its lock")
                self.path.unlink(missing_ok=True)
                return
            self.suspect = holder[0]
            time.sleep(self.poll)
            return
        self.suspect = None
        if not self.waited:
            who = f"process {holder[0]} on {holder[1]}" if holder else "another process"
            self.say(f"waiting for {who}, which is building {self.entry.name} in {self.entry.parent} "
                     "(built once, then shared)")
            self.waited = True
        time.sleep(self.poll)

    def _refuse_other_host(self, fd: int, left: str) -> None:
        """Nothing to refuse: the OS lock is ours, and a second builder elsewhere only costs time."""


def _gone(pid: int) -> bool:
    """Whether no process of this host has `pid`."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:   # alive, another user's
        return False
    return False


def _parse_holder(text: str) -> tuple[int, str] | None:
    """(pid, host) from a lock file's text, or None when it names none."""
    try:
        holder = json.loads(text)
        return int(holder["pid"]), str(holder["host"])
    except (ValueError, KeyError, TypeError):
        return None


def _read_holder(path: Path) -> tuple[int, str] | None:
    try:
        return _parse_holder(path.read_text())
    except OSError:
        return None


def release_all_locks() -> None:
    """Remove every lock this process holds: it is about to end by a signal, past any `finally`."""
    for key in list(_HELD):
        fd, _ = _HELD.pop(key)
        Path(key).unlink(missing_ok=True)
        os.close(fd)

"""Writing files so that a crash never leaves a half-written one under the final name."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary name beside ``path``; when the block ends without error the file is
    moved onto ``path`` in one step (same directory, so the rename is atomic), else removed.
    An existing ``path`` stays intact until then."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_json(path: str | os.PathLike, data, **dumps) -> None:
    """Write ``data`` as UTF-8 JSON (indented, non-ASCII kept) atomically."""
    options = {"indent": 2, "ensure_ascii": False, **dumps}
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, **options) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------ protected outputs
LOCK_NAME = ".zhnlp.lock"


def entries(directory: str | os.PathLike) -> list[str]:
    """The names in ``directory`` other than zhnlp's lock file ([] when it does not exist)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if p.name != LOCK_NAME)


def _shown(names: list[str], limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


class DirectoryLock:
    """An exclusive lock on a run directory, held for the lifetime of the run.

    ``OUTPUT/.zhnlp.lock`` is locked with ``flock`` and holds the holder's pid, host and start time.
    The kernel releases the lock when the holder exits, however it exits (SIGKILL included), so a
    dead run never leaves a stale lock behind (only, after SIGKILL, an unlocked file that the next run
    takes over); a second run into the same directory fails at once, naming the holder."""

    def __init__(self, directory: str | os.PathLike, flag: str = "--output"):
        self.directory, self.flag = Path(directory), flag
        self.path = self.directory / LOCK_NAME
        self._file = None

    def acquire(self) -> "DirectoryLock":
        import fcntl
        import socket
        import time

        self.created = not self.directory.exists()  # a failed run removes what it created (see discard)
        self.directory.mkdir(parents=True, exist_ok=True)
        while True:
            f = open(self.path, "a+", encoding="utf-8")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                try:
                    holder = json.loads(f.read() or "{}")
                except json.JSONDecodeError:
                    holder = {}
                f.close()
                from zhnlp.errors import OutputExistsError

                started = holder.get("started")
                since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else "?"
                raise OutputExistsError(
                    f"{self.directory} is in use by another run (pid {holder.get('pid', '?')} on "
                    f"{holder.get('host', '?')}, started {since}); wait for it to end or choose another {self.flag}."
                ) from None
            # the holder before us removes the file as it releases: a lock on a file no longer at the path
            # would exclude nobody, so lock the file that is there now
            try:
                same = os.stat(self.path).st_ino == os.fstat(f.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            f.close()
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}) + "\n")
        f.flush()
        self._file = f
        return self

    def release(self) -> None:
        """Give the lock up and remove the lock file (removed while still locked, so that a run
        locking it meanwhile sees it gone and locks the new file instead)."""
        if self._file is not None:
            self.path.unlink(missing_ok=True)
            self._file.close()
            self._file = None

    def discard(self) -> None:
        """Release, and remove the directory again if this lock created it and nothing was written
        there (a run that failed before its first output leaves no trace)."""
        self.release()
        if self.created and not entries(self.directory):
            with contextlib.suppress(OSError):
                self.directory.rmdir()

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def claim_directory(directory: str | os.PathLike, *, overwrite: bool, keep: bool = False, flag: str = "--output",
                    what: str = "run directory") -> DirectoryLock:
    """Lock ``directory`` for a run and make sure it will not mix with an earlier run's results: a
    directory that holds anything is refused unless ``overwrite`` (the caller deletes the earlier
    results with :func:`remove_outputs` once it knows it can run) or ``keep`` (a resume that
    continues the run that is there). Returns the held lock; the caller releases it."""
    from zhnlp.errors import OutputExistsError

    lock = DirectoryLock(directory, flag).acquire()
    found = entries(directory)
    if found and not (overwrite or keep):
        lock.discard()
        raise OutputExistsError(
            f"{flag} {directory}: this {what} already holds {_shown(found)}; pass --overwrite to replace that "
            f"run's results, or choose another {flag}.")
    return lock


def remove_outputs(directory: str | os.PathLike, names: tuple[str, ...]) -> list[str]:
    """Delete ``names`` (files or folders) from ``directory``: only what zhnlp itself writes there,
    never other files. Returns the names removed."""
    import shutil

    removed = []
    for name in names:
        target = Path(directory) / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        else:
            continue
        removed.append(name)
    return removed


def refuse_existing(paths: list[Path], *, overwrite: bool, flag: str, what: str) -> None:
    """OutputExistsError when any of ``paths`` exists and ``overwrite`` is not set."""
    from zhnlp.errors import OutputExistsError

    found = [str(p) for p in paths if p.exists()]
    if found and not overwrite:
        raise OutputExistsError(f"{flag}: {what} exists already ({_shown(found)}); pass --overwrite to replace it, "
                                f"or choose another {flag}.")


def swap_directory(work: str | os.PathLike, final: str | os.PathLike) -> None:
    """Put the completed directory ``work`` in the place of ``final`` (which may exist): ``final`` is
    renamed aside, ``work`` renamed into place, then the old one deleted, so that at every moment
    ``final`` is either the old or the new directory, never a mix of both."""
    import shutil

    work, final = Path(work), Path(final)
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        final.rename(old)
    work.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def undecodable(data: bytes) -> str | None:
    """None when ``data`` is UTF-8, else where it is not: 'invalid byte 0xNN on line L' (lines
    counted as text files count them: \\n, \\r\\n or \\r)."""
    try:
        data.decode("utf-8")
        return None
    except UnicodeDecodeError as e:
        start = e.start
    line = data[:start].replace(b"\r\n", b"\n").replace(b"\r", b"\n").count(b"\n") + 1
    return f"invalid byte 0x{data[start]:02x} on line {line}"


def read_utf8(path: str | os.PathLike, error: type[Exception], fix: str, what: str = "") -> str:
    """The text of ``path`` (UTF-8, a BOM dropped); otherwise ``error("WHAT PATH is not UTF-8 text
    (invalid byte 0xNN on line L); FIX")``, naming the file and the place."""
    data = Path(path).read_bytes()
    problem = undecodable(data)
    if problem:
        raise error(f"{what}{path} is not UTF-8 text ({problem}); {fix}")
    return data.decode("utf-8-sig")

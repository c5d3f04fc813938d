"""Run folders: named safely, never overwritten, used by one process at a time, never written through a link.

* :func:`check_run_name`: ``trainer.run_name`` is one plain folder name, so a run stays inside ``trainer.out_dir``.
* :func:`choose_run_dir`: a new run never lands in a non-empty folder: ``NAME`` is taken, so ``NAME-v2``, ``NAME-v3``...
  (the first free one); with ``trainer.overwrite`` the old folder is renamed aside (``NAME.replaced-<time>``),
  never deleted (:func:`claim_run_dir`).
* :func:`claim_run_dir`: an exclusive, non-blocking ``flock`` on ``RUN/.lock`` (holding the pid of its holder)
  for as long as the run trains; a second fit or resume of the same folder fails at once, naming that pid.
* symbolic links: the run folder, its ``checkpoints/``, ``logs/``, ``tb/``, ``figures/``, ``config.yaml`` and
  ``report.json`` must not be links (:func:`refuse_links`); :func:`write_text_nofollow` writes without following one.
* :func:`resolve_resume`: ``--resume`` takes a run folder or any checkpoint file inside it.
* :func:`write_new_text` and :func:`new_folder`: what ``eval`` and ``viz`` add to a run folder (``eval.json``,
  ``eval-2.json``...; ``viz``, ``viz-2``...) goes to a new name, never over an existing file or through a link.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import time
from pathlib import Path

LOCK_NAME = ".lock"
# what fit writes inside a run folder: none of them may be a symbolic link
GUARDED = ("checkpoints", "logs", "tb", "figures", "config.yaml", "report.json")


class RunFolderError(OSError):
    """A run folder that cannot be used: in use by another process, a symbolic link, not a run folder..."""

    def __str__(self) -> str:  # OSError formats (errno, strerror) pairs; ours is one message
        return str(self.args[0]) if self.args else ""


class RunFolderBusy(RunFolderError):
    """Another process holds the run folder's lock."""


def check_run_name(name: str, key: str = "trainer.run_name") -> str:
    """``name`` if it is a single plain folder name; else a :class:`~rlattention.engine.config.ConfigError`."""
    from rlattention.engine.config import ConfigError

    bad = (
        not isinstance(name, str)
        or not name.strip()
        or name.startswith(".")
        or "/" in name
        or "\\" in name
        or "\0" in name
        or ".." in name.split(os.sep)
        or Path(name).is_absolute()
    )
    if bad:
        raise ConfigError(
            f"{key} must be a single folder name (no '/', '\\' or '..', not empty, not starting with '.'), got {name!r}"
        )
    return name


def _is_link(path: Path) -> bool:
    return os.path.islink(path)


def refuse_links(run_dir: Path, names: tuple[str, ...] = GUARDED) -> None:
    """A :class:`RunFolderError` when ``run_dir`` or one of ``names`` inside it is a symbolic link."""
    run_dir = Path(run_dir)
    for path in (run_dir, *(run_dir / n for n in names)):
        if _is_link(path):
            raise RunFolderError(
                f"{path} is a symbolic link (to {os.readlink(path)}); a run never writes through a link: "
                "remove it or choose another trainer.run_name"
            )


def _occupied(path: Path) -> bool:
    """Whether a new run may not use ``path``: anything but a missing path or an empty real folder."""
    if not os.path.lexists(path):
        return False
    if _is_link(path) or not path.is_dir():
        return True
    try:
        with os.scandir(path) as it:
            return any(True for _ in it)
    except OSError:
        return True  # unreadable: not ours to use


def choose_run_dir(out_dir: str | os.PathLike, name: str, overwrite: bool = False) -> Path:
    """The folder of a new run named ``name``: ``out_dir/name`` when it is free (missing or an empty folder) or
    ``overwrite`` is set, else the first free ``out_dir/name-vK`` (K = 2, 3, ...). Creates nothing."""
    check_run_name(name)
    base = Path(out_dir) / name
    if _is_link(base):
        refuse_links(base, ())
    if overwrite or not _occupied(base):
        return base
    k = 2
    while _occupied(base.with_name(f"{name}-v{k}")):
        k += 1
    return base.with_name(f"{name}-v{k}")


def _holder(lock_path: Path) -> str:
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return "unknown"
    try:
        text = os.read(fd, 64).decode(errors="replace").strip()
    finally:
        os.close(fd)
    return text if text.isdigit() else "unknown"


class RunLock:
    """The exclusive lock of a run folder (``RUN/.lock``, holding the holder's pid); :meth:`release` frees it."""

    def __init__(self, run_dir: Path, fd: int) -> None:
        self.run_dir = run_dir
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __del__(self) -> None:
        self.release()

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_run_dir(run_dir: Path, record_pid: bool = True) -> RunLock:
    """Take the run folder's lock without waiting: a :class:`RunFolderBusy` naming the folder and the pid of the
    process that holds it when another one does; ``record_pid``: write this process's pid into the lock file.
    ``run_dir`` must exist."""
    run_dir = Path(run_dir)
    refuse_links(run_dir, ())
    path = run_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RunFolderError(f"{path} is a symbolic link; a run never writes through a link") from None
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise RunFolderBusy(
                f"run folder {run_dir} is in use by another process (pid {_holder(path)}); "
                "wait for it to end, or choose another trainer.run_name"
            ) from None
        raise
    if record_pid:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return RunLock(run_dir, fd)


def check_not_busy(run_dir: Path) -> None:
    """Fail at once (:class:`RunFolderBusy`) when another process holds ``run_dir``'s lock; takes nothing (the
    lock is tried and released at once) and creates nothing."""
    path = Path(run_dir) / LOCK_NAME
    if _is_link(path) or not path.is_file():
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise RunFolderBusy(
                f"run folder {run_dir} is in use by another process (pid {_holder(path)}); "
                "wait for it to end, or choose another trainer.run_name"
            ) from None
    finally:
        os.close(fd)  # closing releases a lock taken here


def _move_aside(run_dir: Path) -> Path:
    """Rename ``run_dir`` to ``<name>.replaced-<time>`` (a free name) while holding its lock; returns the new path."""
    with lock_run_dir(run_dir, record_pid=False):  # the folder is kept as it is (its .lock included)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = run_dir.with_name(f"{run_dir.name}.replaced-{stamp}")
        k = 2
        while os.path.lexists(aside):
            aside = run_dir.with_name(f"{run_dir.name}.replaced-{stamp}-{k}")
            k += 1
        os.rename(run_dir, aside)  # the lock file moves with it; closing it below releases the lock
    return aside


def claim_run_dir(run_dir: Path, fresh: bool, overwrite: bool = False, make=None) -> RunLock:
    """Make ``run_dir`` this process's run folder and lock it (rank 0 only): refuses symbolic links; a ``fresh``
    run with ``overwrite`` first renames a non-empty folder aside; ``make(run_dir)`` creates it (and may probe
    that it is writable); a fresh run's folder must then hold nothing but the lock (another process did not
    start in it meanwhile). Returns the held :class:`RunLock`."""
    run_dir = Path(run_dir)
    refuse_links(run_dir, ())
    if fresh and overwrite and _occupied(run_dir):
        aside = _move_aside(run_dir)
        print(f"trainer.overwrite: the previous run folder {run_dir} is kept as {aside}", flush=True)
    if make is not None:
        make(run_dir)
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
    lock = lock_run_dir(run_dir)
    try:
        refuse_links(run_dir)
        if fresh:
            others = sorted(set(os.listdir(run_dir)) - {LOCK_NAME})
            if others:
                raise RunFolderError(
                    f"run folder {run_dir} was filled by another process while this run started "
                    f"({', '.join(others[:3])}); start again (a new run never writes into a used folder)"
                )
    except BaseException:
        lock.release()
        raise
    return lock


def write_text_nofollow(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, refusing (:class:`RunFolderError`) when ``path`` is a symbolic link."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RunFolderError(f"{path} is a symbolic link; a run never writes through a link") from None
        raise
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _numbered(base: Path, k: int) -> Path:
    """``base`` for k = 1, else ``<stem>-<k><suffix>``: ``eval.json``, ``eval-2.json``...; ``viz``, ``viz-2``..."""
    return base if k == 1 else base.with_name(f"{base.stem}-{k}{base.suffix}")


def _refuse_link(path: Path, what: str) -> None:
    if _is_link(path):
        raise RunFolderError(
            f"{path} is a symbolic link (to {os.readlink(path)}); {what} is never written through a link: remove it"
        )


def write_new_text(path: str | os.PathLike, text: str, numbered: bool = True) -> Path:
    """Write ``text`` to a new file and return its path: ``path`` if that name is free, else (``numbered``) the
    first free ``<stem>-2<suffix>``, ``<stem>-3<suffix>``... in the same folder; ``numbered=False``: a
    :class:`RunFolderError` when ``path`` exists. Never replaces a file: the text is written whole to a temporary
    file (``fsync``) which is then hard-linked to the new name, and a link fails when the name exists. Never
    writes through a symbolic link: the folder or a name tried being a link is a :class:`RunFolderError`."""
    path = Path(path)
    folder = path.parent
    _refuse_link(folder, "a result")
    tmp = folder / f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        k = 1
        while True:
            target = _numbered(path, k)
            _refuse_link(target, "a result")
            try:
                os.link(tmp, target, follow_symlinks=False)
                return target
            except FileExistsError:
                if not numbered:
                    raise RunFolderError(f"{target} exists; it is never overwritten: choose another name") from None
                k += 1
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def new_folder(path: str | os.PathLike, numbered: bool = True) -> Path:
    """Create and return a new, empty folder: ``path`` if that name is free, else (``numbered``) the first free
    ``<name>-2``, ``<name>-3``...; ``numbered=False``: ``path`` itself, which may already exist as an empty real
    folder (a :class:`RunFolderError` when it holds anything or is a link). Its parent must not be a link."""
    path = Path(path)
    _refuse_link(path.parent, "a result")
    k = 1
    while True:
        target = _numbered(path, k)
        _refuse_link(target, "a result")
        try:
            os.mkdir(target)
            return target
        except FileExistsError:
            if not numbered:
                if _occupied(target):
                    raise RunFolderError(
                        f"{target} exists and is not an empty folder; nothing in it is overwritten: choose a new or "
                        "empty folder"
                    ) from None
                return target
            k += 1


def find_run_dir(path: str | os.PathLike) -> Path | None:
    """The nearest folder at or above ``path`` holding a ``config.yaml`` and a ``checkpoints/`` folder."""
    p = Path(path).absolute()
    for folder in (p, *p.parents) if p.is_dir() else p.parents:
        if (folder / "config.yaml").is_file() and (folder / "checkpoints").is_dir():
            return folder
    return None


def resolve_resume(path: str | os.PathLike) -> tuple[Path, Path]:
    """``(run folder, checkpoint)`` of ``--resume PATH``: a run folder (its ``checkpoints/last.ckpt``), a folder
    inside one, or any checkpoint file inside one (the run folder is the nearest folder above it holding a
    ``config.yaml`` and a ``checkpoints/`` folder). One-line :class:`~rlattention.engine.checkpoint.CheckpointError`
    otherwise."""
    from rlattention.engine.checkpoint import CheckpointError

    given = Path(path)
    if not given.exists():
        raise CheckpointError(f"--resume: checkpoint or run folder not found: {given}")
    run = find_run_dir(given)
    if given.is_dir():
        if run is None:
            raise CheckpointError(
                f"--resume: {given} is not a run folder (no config.yaml and checkpoints/ in it or above it)"
            )
        ckpt = run / "checkpoints" / "last.ckpt"
        if not ckpt.is_file():
            found = sorted(p.name for p in (run / "checkpoints").rglob("*.ckpt") if not p.name.startswith("."))
            if not found:
                raise CheckpointError(f"--resume: run folder {run} has no checkpoint (checkpoints/ holds no .ckpt)")
            raise CheckpointError(
                f"--resume: {ckpt} not found; pass one of the run's checkpoints instead ({', '.join(found[:5])})"
            )
        return _keep_relative(run, given), _keep_relative(ckpt, given)
    if run is None:
        raise CheckpointError(
            f"--resume: {given} is not inside a run folder (no folder above it holds config.yaml and checkpoints/)"
        )
    return _keep_relative(run, given), given


def _keep_relative(p: Path, given: Path) -> Path:
    """``p`` (absolute) relative to the working folder when ``given`` was relative, as the user wrote it."""
    if given.is_absolute():
        return p
    with contextlib.suppress(ValueError):
        return p.relative_to(Path.cwd())
    return p

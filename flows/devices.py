"""The devices flow runs share.

Across machines, an ablation sweep's cells share a Prefect global concurrency limit with one slot per GPU: the
sweep (:mod:`flows.sweep`) sets the limit to its ``devices``; each cell (a run of the curriculum flow,
:mod:`flows.curriculum`) holds one slot while it trains, so whatever serves or works the cells' deployment never
trains more cells at once than there are devices.

On one machine, the flow runs a worker starts side by side (``scripts/worker.sh``, one slot per device) each hold
their own devices of ``VGRPO_DEVICES`` (:func:`local_devices`): an exclusive lock file per device, and
``CUDA_VISIBLE_DEVICES`` set to the ones held, so two runs never train on the same GPU. The lock files live in a
folder private to the worker's user (``<tmp>/vgrpo-devices-<uid>``, mode 0700, refused when another user owns it
or it is a symlink) and are opened without following a symlink and without truncating: another local user cannot
make a run write through a planted link.
"""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import IO

from prefect import get_client
from prefect.concurrency.sync import concurrency

__all__ = ["DEVICE_LIMIT", "device_slot", "local_devices", "private_lock_dir", "set_device_limit"]

DEVICE_LIMIT = "vgrpo-devices"
"""The global concurrency limit's name."""


@contextmanager
def device_slot() -> Iterator[None]:
    """Hold one slot of :data:`DEVICE_LIMIT` while a cell trains (no limit when the limit does not exist, as in
    a cell run outside a sweep)."""
    with concurrency(DEVICE_LIMIT, occupy=1, strict=False):
        yield


def set_device_limit(devices: int) -> None:
    """Create or resize :data:`DEVICE_LIMIT` to ``devices`` slots."""
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(DEVICE_LIMIT, devices)


def _devices(spec: str | None) -> list[str]:
    """The GPUs ``VGRPO_DEVICES`` lists (``0,1,2,3``); none for ``cpu:N`` or when it is unset."""
    if not spec or spec.startswith("cpu"):
        return []
    return [d.strip() for d in spec.split(",") if d.strip()]


def private_lock_dir(folder: Path | None = None) -> Path:
    """The folder of this user's device lock files (default ``<tmp>/vgrpo-devices-<uid>``), created 0700; a
    :class:`PermissionError` naming it when it is a symlink, another user's, or writable by others."""
    folder = folder or Path(tempfile.gettempdir()) / f"vgrpo-devices-{os.getuid()}"
    with suppress(FileExistsError):
        folder.mkdir(mode=0o700, parents=True)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise PermissionError(
            f"device lock folder {folder}: must be a folder of this user (uid {os.getuid()}) that no one else can "
            f"write (found uid {info.st_uid}, mode {stat.filemode(info.st_mode)}); remove it or set another"
        )
    return folder


def _open_lock(path: Path) -> IO[str]:
    """``path`` opened for locking: created 0600 if absent, never truncated, never through a symlink (a
    :class:`PermissionError` naming it)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if path.is_symlink():
            raise PermissionError(f"device lock file {path} is a symlink: refusing to open it") from exc
        raise
    return os.fdopen(fd, "r+")


@contextmanager
def local_devices(
    count: int = 1, spec: str | None = None, lock_dir: Path | None = None, poll_s: float = 2.0
) -> Iterator[list[str]]:
    """Hold ``count`` of this machine's devices (``spec``, default ``VGRPO_DEVICES``), waiting until that many
    are free, with ``CUDA_VISIBLE_DEVICES`` set to them while held; yields their ids (none, and nothing set, when
    the machine lists no GPU). Raises ValueError when the machine has fewer than ``count``."""
    devices = _devices(spec if spec is not None else os.environ.get("VGRPO_DEVICES"))
    if not devices:
        yield []
        return
    if count > len(devices):
        raise ValueError(f"a run needs {count} devices; VGRPO_DEVICES lists {len(devices)}: {','.join(devices)}")
    folder = private_lock_dir(lock_dir)
    while True:  # all at once or none: a run holding some while waiting for more could deadlock another
        stack = ExitStack()
        held: list[str] = []
        for device in devices:
            if len(held) == count:
                break
            handle = _open_lock(folder / f"{device}.lock")  # closed by the stack
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            stack.enter_context(handle)  # closing the file releases its lock
            held.append(device)
        if len(held) == count:
            break
        stack.close()
        time.sleep(poll_s)
    with stack:
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(held)
        try:
            yield held
        finally:
            if saved is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = saved

"""Flow runs side by side on one worker hold distinct devices: lock files per device, all at once or none, and
CUDA_VISIBLE_DEVICES set while held."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from flows.devices import local_devices


def test_runs_hold_distinct_devices_and_wait_for_a_free_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with local_devices(1, "0,1", tmp_path) as first:
        assert first == ["0"] and os.environ["CUDA_VISIBLE_DEVICES"] == "0"
        with local_devices(1, "0,1", tmp_path) as second:
            assert second == ["1"]
        got: list[list[str]] = []

        def third() -> None:
            with local_devices(2, "0,1", tmp_path, poll_s=0.05) as both:
                got.append(both)

        waiting = threading.Thread(target=third)
        waiting.start()
        time.sleep(0.3)
        assert not got  # "0" is held: a run that needs both waits, holding neither meanwhile
        with local_devices(1, "0,1", tmp_path) as meanwhile:
            assert meanwhile == ["1"]
    waiting.join(timeout=5)
    assert got == [["0", "1"]]
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_a_machine_without_gpus_pins_nothing_and_too_many_is_refused(tmp_path: Path) -> None:
    with local_devices(1, "cpu:2", tmp_path) as none:
        assert none == []
    with pytest.raises(ValueError, match="needs 3 devices; VGRPO_DEVICES lists 2"), local_devices(3, "0,1", tmp_path):
        pass


def test_a_symlink_planted_as_a_lock_file_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "precious.conf"
    target.write_text("root-owned settings\n")
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    (locks / "0.lock").symlink_to(target)
    with pytest.raises(PermissionError, match=r"0\.lock is a symlink"), local_devices(1, "0", locks):
        pass
    assert target.read_text() == "root-owned settings\n"  # not truncated, not written


def test_a_lock_folder_others_can_write_or_a_symlinked_one_is_refused(tmp_path: Path) -> None:
    from flows.devices import private_lock_dir

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # what /tmp/vgrpo-devices was: every local user could plant links in it
    with pytest.raises(PermissionError, match="that no one else can write"):
        private_lock_dir(shared)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    with pytest.raises(PermissionError, match="must be a folder of this user"):
        private_lock_dir(tmp_path / "link")
    if os.geteuid() == 0:  # another user's folder (root can make one here)
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(PermissionError, match="found uid 65534"):
            private_lock_dir(theirs)
    made = private_lock_dir(tmp_path / "mine")
    assert made.stat().st_mode & 0o777 == 0o700


def test_the_default_lock_folder_is_private_to_the_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import tempfile

    from flows.devices import private_lock_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = private_lock_dir()
    assert folder == tmp_path / f"vgrpo-devices-{os.getuid()}" and folder.stat().st_mode & 0o777 == 0o700
    with local_devices(1, "0", None) as held:
        assert held == ["0"] and (folder / "0.lock").stat().st_mode & 0o777 == 0o600

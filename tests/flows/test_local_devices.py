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

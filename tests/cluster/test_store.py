"""The shared store: complete-or-absent folders with checked listings, on a folder and on a real S3-compatible
server on 127.0.0.1; a stage's adapter found by its content hash and its checkpoints restored on another machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.stage_layout import MANIFEST, dir_hash
from tasks.stage_store import CheckpointUpload, publish_stage, restore_checkpoints, restore_stage, run_key
from tasks.store import COMPLETE, Store, StoreError
from tests.cluster.servers import environ, s3_server


def _folder(path: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)
    return path


def _roundtrip(store: Store, tmp_path: Path) -> None:
    src = _folder(tmp_path / "src", {"a.bin": b"\x00\x01" * 1000, "sub/b.json": b'{"x": 1}'})
    assert not store.has("things/one")
    with pytest.raises(StoreError, match="things/one is absent or incomplete"):
        store.get_dir("things/one", tmp_path / "dst")
    store.put_dir(src, "things/one")
    assert store.has("things/one") and store.children("things") == ["one"]
    out = store.get_dir("things/one", tmp_path / "dst")
    assert dir_hash(out) == dir_hash(src)
    # A folder whose files changed after their listing was written is refused by name, and nothing is replaced.
    with store.fs.open(store.path("things/one/a.bin"), "wb") as f:
        f.write(b"tampered")
    with pytest.raises(StoreError, match=r"things/one/a\.bin does not match its listing"):
        store.get_dir("things/one", tmp_path / "dst")
    assert dir_hash(tmp_path / "dst") == dir_hash(src)
    # Files without their listing (an upload cut short) are not a folder.
    store.fs.rm(store.path("things/one/" + COMPLETE))
    assert not store.has("things/one") and store.children("things") == []


def test_a_folder_store_keeps_folders_complete_or_absent(tmp_path: Path) -> None:
    _roundtrip(Store(str(tmp_path / "store")), tmp_path)


@pytest.mark.slow
def test_an_s3_store_on_a_real_s3_compatible_server(tmp_path: Path) -> None:
    with s3_server(tmp_path) as env, environ(env):
        _roundtrip(Store("s3://vgrpo/team"), tmp_path)


def _stage_on(machine: Path, name: str, payload: bytes) -> Path:
    """A finished stage in ``machine``'s run folder: its adapter and the manifest naming its hash."""
    run = machine / "runs" / "curriculum" / "c"
    out = _folder(run / "stages" / name, {"adapter_model.safetensors": payload})
    (run / "work" / name).mkdir(parents=True, exist_ok=True)
    (run / "work" / name / MANIFEST).write_text(json.dumps({"fingerprint": "f", "hash": dir_hash(out)}))
    return run


def test_machine_b_restores_the_stage_and_checkpoints_machine_a_published(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "store"))
    a, b = tmp_path / "a", tmp_path / "b"
    run_a = _stage_on(a, "s1", b"weights")
    digest = publish_stage(store, run_a, "s1", root=a)
    assert store.has(f"adapters/{digest}")
    assert run_key(run_a, a) == "runs/curriculum/c"
    run_b = b / "runs" / "curriculum" / "c"
    assert restore_stage(store, run_b, "s1", root=b)
    assert dir_hash(run_b / "stages" / "s1") == digest
    assert not restore_stage(store, run_b, "s2", root=b)  # never published: B trains it
    # A checkpoint A wrote mid-stage reaches B before B trains.
    ckpt = _folder(run_a / "work" / "s2" / "checkpoints" / "iter-10", {"state.json": b"{}", "lora.pt": b"w"})
    CheckpointUpload(store, run_a, "s2", root=a).on_checkpoint(ckpt, 10)
    assert restore_checkpoints(store, run_b, "s2", root=b) == ["iter-10"]
    assert (run_b / "work" / "s2" / "checkpoints" / "iter-10" / "lora.pt").read_bytes() == b"w"
    assert restore_checkpoints(store, run_b, "s2", root=b) == []  # already here

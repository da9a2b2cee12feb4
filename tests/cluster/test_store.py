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


def _plant_listing(store: Store, key: str, listing: dict[str, object], files: dict[str, bytes]) -> None:
    """What an attacker who can write the store plants: files and a ``.complete`` listing of its choosing."""
    for rel, data in files.items():
        store.fs.makedirs(store.path(key), exist_ok=True)
        with store.fs.open(store.path(key) + "/" + rel.replace("/", "_"), "wb") as f:
            f.write(data)
    with store.fs.open(store.path(key) + "/" + COMPLETE, "w") as f:
        f.write(json.dumps(listing))


@pytest.mark.parametrize(
    "name",
    ["../escaped.pth", "sub/../../escaped.pth", "/ABS/escaped.pth", "", ".", "a//b", "a\\..\\escaped.pth"],
)
def test_a_listing_naming_a_file_outside_its_folder_writes_nothing(tmp_path: Path, name: str) -> None:
    import hashlib

    store = Store(str(tmp_path / "store"))
    payload = b"import os; os.system('touch owned')\n"
    name = name.replace("/ABS", str(tmp_path))
    entry = {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    _plant_listing(store, "adapters/evil", {"ok.bin": entry, name: entry}, {"ok.bin": payload})
    dest = tmp_path / "run" / "stages" / "s1"
    with pytest.raises(StoreError, match=r"is not a relative path|has an empty, '\.' or '\.\.' part"):
        store.get_dir("adapters/evil", dest)
    # Nothing written anywhere, not even the listed file that was fine: the names are checked before any download.
    assert [p for p in tmp_path.rglob("*") if p.is_file() and "store" not in p.relative_to(tmp_path).parts] == []


def test_a_listing_entry_that_is_not_a_size_and_a_hash_is_refused(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "store"))
    _plant_listing(store, "adapters/odd", {"a.bin": {"size": "1", "sha256": 3}}, {"a.bin": b"x"})
    with pytest.raises(StoreError, match=r"the entry of 'a\.bin' is not a size and a SHA-256"):
        store.get_dir("adapters/odd", tmp_path / "dst")
    assert not (tmp_path / "dst").exists()


def test_store_keys_with_dot_dot_are_refused_and_odd_children_skipped(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "store"))
    for key in ("adapters/../../etc", "runs/./x", "a//b"):
        with pytest.raises(StoreError, match=r"'\.' or '\.\.' part"):
            store.path(key)
    src = _folder(tmp_path / "src", {"a.bin": b"a"})
    store.put_dir(src, "things/one")
    (tmp_path / "store" / "things" / "we\\ird").mkdir()
    (tmp_path / "store" / "things" / "we\\ird" / COMPLETE).write_text("{}")
    assert store.children("things") == ["one"]


def test_an_upload_with_a_symlink_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("AWS_SECRET_ACCESS_KEY=...")
    src = _folder(tmp_path / "ckpt", {"state.json": b"{}"})
    (src / "lora.pt").symlink_to(secret)
    store = Store(str(tmp_path / "store"))
    with pytest.raises(StoreError, match=r"refusing to upload the symlink .*lora\.pt"):
        store.put_dir(src, "runs/x/work/s1/checkpoints/iter-1")
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("*.*"))


def test_json_is_written_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    store = Store(str(tmp_path / "store"))
    store.put_json("runs/x/results.json", {"v": 1})
    assert store.get_json("runs/x/results.json") == {"v": 1}

    def crash(src: str, dst: str) -> None:
        raise OSError("power cut before the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="power cut"):
        store.put_json("runs/x/results.json", {"v": 2, "long": "x" * 100_000})
    monkeypatch.undo()
    assert store.get_json("runs/x/results.json") == {"v": 1}  # the old file, whole
    assert [p.name for p in (tmp_path / "store" / "runs" / "x").iterdir()] == ["results.json"]  # no temporary left


def test_a_stage_outcome_crosses_machines_as_json_naming_its_output(tmp_path: Path) -> None:
    from tasks.outcome import StageOutcome
    from tasks.stage_store import publish_outcome, published_outcome

    store = Store(str(tmp_path / "store"))
    run = tmp_path / "a" / "runs" / "curriculum" / "c"
    outcome = StageOutcome("s1", str(run / "stages" / "s1"), "h1", run_id="r", history=({"loss": 0.5},))
    publish_outcome(store, run, "s1", outcome.to_json(), root=tmp_path / "a")
    raw = (tmp_path / "store" / "runs" / "curriculum" / "c" / "work" / "s1" / "outcome.json").read_text()
    assert json.loads(raw)["hash"] == "h1"  # plain JSON: nothing in it is code
    other = tmp_path / "b" / "runs" / "curriculum" / "c"
    assert StageOutcome.from_json(published_outcome(store, other, "s1", "h1", root=tmp_path / "b")) == outcome
    assert published_outcome(store, other, "s1", "another-output", root=tmp_path / "b") is None
    assert published_outcome(store, other, "s2", "h1", root=tmp_path / "b") is None

"""Whoever writes the shared store runs no code on the machines that read it through Prefect: the team's
environment keeps Prefect's result records (pickles, read with the serializer the record names) on each machine, a
record planted where an earlier ``up`` put them is never read, and a flow refuses result storage in the store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.team import TeamServices, team_env
from tasks.store import Store, StoreError, check_results_stay_local

CLIENT = """
import sys
from prefect import flow, task

@task(persist_result=True, cache_key_fn=lambda context, parameters: sys.argv[1])
def expensive() -> int:
    return 42

@flow(name="planted-record-check")
def check() -> int:
    return expensive()

print("RESULT", check())
"""


class _Payload:
    """What a planted pickle runs when it is read: it creates ``marker`` (any command would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, int, bool]]:
        return (os.makedirs, (str(self.marker), 0o755, True))  # Prefect may read a record more than once


def _plant(folder: Path, key: str, marker: Path) -> None:
    """A Prefect result record at ``folder/key`` whose unpickling creates ``marker``, as Prefect itself writes one."""
    from prefect._internal.result_records import ResultRecord, ResultRecordMetadata
    from prefect.serializers import PickleSerializer

    folder.mkdir(parents=True, exist_ok=True)
    metadata = ResultRecordMetadata(storage_key=str(folder / key), serializer=PickleSerializer())
    (folder / key).write_bytes(ResultRecord(metadata=metadata, result=_Payload(marker)).serialize())


@pytest.mark.slow
def test_a_pickle_planted_in_the_store_is_never_read_by_a_machine_of_the_team(tmp_path: Path) -> None:
    from services.local import local_services

    store = tmp_path / "store"
    with local_services(tmp_path / "services") as services:
        port = int(services.env["PREFECT_API_URL"].rsplit(":", 1)[1].split("/")[0])
        team = TeamServices(tmp_path / "team", str(store), prefect_port=port)
        home = tmp_path / "machine" / ".prefect"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
        env |= team_env(team) | {"PREFECT_HOME": str(home)}

        def run(key: str) -> str:
            done = subprocess.run(
                [sys.executable, "-c", CLIENT, key], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
            )
            assert done.returncode == 0, done.stderr[-3000:]
            return done.stdout

        # The payload is live: planted in the machine's own result storage, Prefect runs it on the cache hit.
        _plant(home / "storage", "own-storage", tmp_path / "ran-from-own-storage")
        assert "RESULT None" in run("own-storage")  # the payload's value: the task did not run
        assert (tmp_path / "ran-from-own-storage").is_dir()
        # Planted in the store, where an earlier `up` pointed every machine's results: never read.
        _plant(store / "prefect-results", "from-the-store", tmp_path / "ran-from-the-store")
        assert "RESULT 42" in run("from-the-store")
        assert not (tmp_path / "ran-from-the-store").exists()
    assert not any(k.startswith("PREFECT_RESULTS") or k == "PREFECT_LOCAL_STORAGE_PATH" for k in team_env(team))


def test_a_flow_refuses_prefect_result_storage_that_other_hosts_write(tmp_path: Path) -> None:
    from prefect.settings import (
        PREFECT_LOCAL_STORAGE_PATH,
        PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK,
        temporary_settings,
    )

    store = Store(str(tmp_path / "store"))
    with temporary_settings({PREFECT_LOCAL_STORAGE_PATH: tmp_path / "store" / "prefect-results"}):
        with pytest.raises(StoreError, match=r"PREFECT_LOCAL_STORAGE_PATH=.*prefect-results lies in the store"):
            check_results_stay_local(store)
        check_results_stay_local(None)  # one machine: its own results, as before
    block = "remote-file-system/vgrpo-results"
    with (
        temporary_settings({PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK: block}),
        pytest.raises(StoreError, match=f"PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK={block}"),
    ):
        check_results_stay_local(store)
    with temporary_settings({PREFECT_LOCAL_STORAGE_PATH: tmp_path / "machine" / "storage"}):
        check_results_stay_local(store)

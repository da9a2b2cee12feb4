"""A stage's ``launch:`` params and the launcher (tasks.launch) without training: the params are checked at load,
the accelerate command line parses as accelerate's own, the launcher streams its processes' lines and stops their
whole process group, a rank's error comes back as its own class, and only rank 0 opens an MLflow run.
``tests/flows/test_launched_curriculum.py`` (slow) launches real stages on two gloo processes."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from tasks.launch import (
    LaunchFailed,
    MachinesLaunchFailed,
    accelerate_command,
    launch_stage,
    read_result,
    rendezvous,
    run_streaming,
)
from tasks.machine_job import MachineJob
from vgrpo.checkpoints.resume import training_hash
from vgrpo.config import StageConfig, load_config
from vgrpo.errors import ConfigError
from vgrpo.parallel.launch import LaunchConfig
from vgrpo.training.guards import TrainingDiverged

STAGE = {
    "name": "tiny",
    "prompts": "train.jsonl",
    "iterations": 1,
    "rewards": [{"name": "geneval"}],
    "rollout": {"prompts_per_iteration": 4, "group_size": 2, "num_steps": 4},
}


def _stage(**launch: Any) -> StageConfig:
    return StageConfig.model_validate({**STAGE, "launch": launch})


# --- params -------------------------------------------------------------------------------------------------------


def test_launch_params_default_to_one_process_and_are_left_out_of_the_training_fingerprint() -> None:
    assert _stage().launch == LaunchConfig() and not _stage().launch.launched
    assert _stage(processes=2).launch.launched
    assert training_hash(_stage(processes=4)) == training_hash(_stage())  # a checkpoint resumes on other counts


@pytest.mark.parametrize(
    ("launch", "message"),
    [
        ({"processes": 3}, r"rollout.prompts_per_iteration=4 must be divisible by the 3 processes"),
        ({"processes": 4, "machines": 3}, r"launch.processes=4 must split evenly over launch.machines=3"),
        ({"processes": 4, "machines": 2}, r"launch.machines=2 needs launch.accelerate_config"),
        ({"mixed_precision": "bf16"}, r"launch.mixed_precision=bf16 differs from precision.autocast=fp32"),
        ({"processes": 0}, r"greater than or equal to 1"),
    ],
)
def test_launch_params_that_cannot_run_fail_at_load_naming_the_setting(
    tmp_path: Path, launch: dict[str, Any], message: str
) -> None:
    params = tmp_path / "stage.yaml"
    params.write_text(yaml.safe_dump({**STAGE, "launch": launch}))
    with pytest.raises(ConfigError, match=message):
        load_config([params], schema=StageConfig)


def test_mixed_precision_must_agree_with_the_autocast() -> None:
    agreed = StageConfig.model_validate(
        {**STAGE, "precision": {"autocast": "bf16"}, "launch": {"mixed_precision": "bf16"}}
    )
    assert agreed.launch.mixed_precision == "bf16"
    with pytest.raises(ValidationError, match="no fp16 autocast"):
        StageConfig.model_validate({**STAGE, "precision": {"autocast": "bf16"}, "launch": {"mixed_precision": "fp16"}})


# --- the command line ---------------------------------------------------------------------------------------------


def test_accelerate_command_is_accelerates_own_launch_of_the_stage_entry_point(tmp_path: Path) -> None:
    from accelerate.commands.launch import launch_command_parser

    cmd = accelerate_command(LaunchConfig(processes=2), tmp_path / "spec.json", tmp_path, port=29123)
    assert cmd[:3] == [sys.executable, "-m", "accelerate.commands.launch"]  # this interpreter's accelerate
    args = launch_command_parser().parse_args(cmd[3:])
    assert (args.num_processes, args.num_machines, args.mixed_precision) == (2, 1, "no")
    assert args.multi_gpu and args.config_file is None and args.main_process_port == 29123
    assert args.module and args.training_script == "tasks.launched_stage"
    assert args.training_script_args == [str(tmp_path / "spec.json")]

    launch = LaunchConfig(processes=16, machines=2, mixed_precision="bf16", accelerate_config="configs/multi.yaml")
    args = launch_command_parser().parse_args(accelerate_command(launch, tmp_path / "spec.json", tmp_path)[3:])
    assert (args.num_processes, args.num_machines, args.mixed_precision, args.machine_rank) == (16, 2, "bf16", 0)
    assert args.config_file == str(tmp_path / "configs/multi.yaml") and not args.multi_gpu  # the file's kind
    assert args.main_process_port is None  # the file's port: the other machines know it


# --- the launcher ---------------------------------------------------------------------------------------------------


def test_run_streaming_passes_each_line_and_returns_the_exit_code() -> None:
    lines: list[str] = []
    code = run_streaming(
        [sys.executable, "-c", "import sys; print('a\\rb'); print('c', file=sys.stderr); sys.exit(3)"], lines.append
    )
    assert code == 3 and lines == ["a", "b", "c"]  # a progress bar's carriage return ends a line


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_an_interrupted_launcher_stops_its_whole_process_group() -> None:
    """What a cancelled flow run (Prefect raises in the task) or Ctrl-C does: the launcher's child and the child's
    own child (a rank under torchrun) are both stopped before the interrupt propagates."""
    script = (
        "import subprocess, sys, time\n"
        "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "print(worker.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    seen: list[int] = []

    def interrupt(line: str) -> None:
        seen.append(int(line))
        raise KeyboardInterrupt

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_streaming([sys.executable, "-c", script], interrupt)
    deadline = time.monotonic() + 10
    while _alive(seen[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(seen[0]) and time.monotonic() - started < 30


def _fake_launch(monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """Replace accelerate by ``script`` (run with the spec's path as its argument)."""
    monkeypatch.setattr(
        "tasks.launch.accelerate_command",
        lambda launch, spec, root, port=None, machine_rank=0, main_ip=None: [sys.executable, "-c", script, str(spec)],
    )


def test_a_ranks_error_comes_back_as_its_class_and_any_other_failure_with_the_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage = _stage(processes=2)
    writes_error = (
        "import json, sys; spec = json.load(open(sys.argv[1])); "
        "open(spec['result'], 'w').write(json.dumps({'error': {'kind': 'TrainingDiverged', "
        "'message': 'stage tiny: 3 consecutive iterations skipped'}})); sys.exit(3)"
    )
    _fake_launch(monkeypatch, writes_error)
    with pytest.raises(TrainingDiverged, match="3 consecutive iterations skipped"):
        launch_stage(stage, None, str(tmp_path / "run"), str(tmp_path), None, log=lambda line: None)

    crashes = (
        "import json, pathlib, sys; spec = json.load(open(sys.argv[1])); "
        "pathlib.Path(spec['logs'], 'rank-1.log').write_text('rank one went wrong'); "
        "print('rank zero says bye'); sys.exit(1)"
    )
    _fake_launch(monkeypatch, crashes)
    lines: list[str] = []
    with pytest.raises(LaunchFailed, match=r"(?s)exited with 1.*rank zero says bye.*rank-1.log:\nrank one went wrong"):
        launch_stage(stage, None, str(tmp_path / "run"), str(tmp_path), None, log=lines.append)
    assert lines[0].startswith("tiny: launching 2 processes") and lines[-1] == "rank zero says bye"


def test_the_entry_point_writes_a_user_error_for_the_caller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks import launched_stage
    from vgrpo.parallel.distributed import Distributed

    def bad_input(*args: Any, **kwargs: Any) -> None:
        raise ConfigError("train.jsonl: prompt file not found")

    monkeypatch.setattr("tasks.stage.train_and_track", bad_input)
    monkeypatch.setattr(Distributed, "from_environment", classmethod(lambda cls: cls()))
    monkeypatch.setenv("RANK", "0")
    spec = tmp_path / "spec.json"
    folders = {"run_root": str(tmp_path), "root": str(tmp_path), "logs": str(tmp_path)}
    spec.write_text(
        json.dumps(
            {"stage": STAGE, "init_lora": None, "tracking": None, "result": str(tmp_path / "result.json"), **folders}
        )
    )
    assert launched_stage.main([str(spec)]) == 2
    with pytest.raises(ConfigError, match="prompt file not found"):
        read_result(tmp_path / "result.json")
    assert read_result(tmp_path / "missing.json") is None


# --- rank 0 alone tracks --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [0, 1])
def test_only_rank_0_opens_the_stages_mlflow_run_and_returns_the_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rank: int
) -> None:
    from mlflow import MlflowClient

    from tasks.stage import MANIFEST, train_and_track
    from tasks.tracking import Tracking, tracking_uri
    from vgrpo.parallel.distributed import Distributed
    from vgrpo.trainer import Trainer
    from vgrpo.training.stage import StageResult

    def trained(
        self: Trainer, **kwargs: Any
    ) -> StageResult:  # the loop itself is tests/flows/test_launched_curriculum.py's
        assert self.dist is dist and (self.callbacks is None) == (rank != 0)
        assert self.out_dir is not None
        self.out_dir.mkdir(parents=True)
        (self.out_dir / "weights.bin").write_bytes(b"rank 0 exports")
        return StageResult(out_dir=self.out_dir, iterations=1, history=[{"reward/total_mean": 0.5}])

    monkeypatch.setattr(Trainer, "train", trained)
    dist = Distributed.__new__(Distributed)  # rank `rank` of two, without a process group
    dist.rank, dist.world_size = rank, 2
    uri = tracking_uri(tmp_path / "mlflow")
    tracking = Tracking(uri, "launch", "tiny", tags={"vgrpo.runner": "test"})
    result = train_and_track(_stage(processes=2), None, str(tmp_path / "run"), str(tmp_path), tracking, dist=dist)
    experiment = MlflowClient(uri).get_experiment_by_name("launch")
    if rank != 0:
        assert result is None and experiment is None  # no run, not even the experiment
        assert not (tmp_path / "run/work/tiny" / MANIFEST).exists()
        return
    (run,) = MlflowClient(uri).search_runs([experiment.experiment_id])
    assert result is not None and result.run_id == run.info.run_id and run.info.status == "FINISHED"
    assert result.history == ({"reward/total_mean": 0.5},) and (tmp_path / "run/work/tiny" / MANIFEST).is_file()


# --- a stage on several machines ------------------------------------------------------------------------------------

TWO_MACHINES = {"processes": 4, "machines": 2, "accelerate_config": "multi.yaml"}


def test_machine_r_joins_machine_0s_rendezvous_on_the_command_line(tmp_path: Path) -> None:
    from accelerate.commands.launch import launch_command_parser

    launch = LaunchConfig(**TWO_MACHINES)
    cmd = accelerate_command(launch, tmp_path / "spec.json", tmp_path, port=29123, machine_rank=1, main_ip="10.0.0.5")
    args = launch_command_parser().parse_args(cmd[3:])
    assert (args.num_machines, args.machine_rank, args.main_process_ip, args.main_process_port) == (
        2,
        1,
        "10.0.0.5",
        29123,
    )


def test_the_rendezvous_is_this_machines_address_or_the_config_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launch = LaunchConfig(**TWO_MACHINES)
    (tmp_path / "multi.yaml").write_text(yaml.safe_dump({"main_process_ip": "10.0.0.1", "main_process_port": 29500}))
    monkeypatch.delenv("VGRPO_HOST", raising=False)
    assert rendezvous(launch, tmp_path) == (None, None)  # the file's address and port, on every machine
    monkeypatch.setenv("VGRPO_HOST", "10.0.0.7")  # a pool's worker: whichever machine took machine 0
    host, port = rendezvous(launch, tmp_path)
    assert host == "10.0.0.7" and isinstance(port, int) and port > 0
    monkeypatch.setenv("VGRPO_PORT", "12345")  # a scheduler's job: the port every machine derived alike
    assert rendezvous(launch, tmp_path) == ("10.0.0.7", 12345)
    monkeypatch.delenv("VGRPO_PORT")
    monkeypatch.delenv("VGRPO_HOST")
    (tmp_path / "multi.yaml").write_text(yaml.safe_dump({"num_machines": 2}))
    with pytest.raises(ConfigError, match=r"set VGRPO_HOST to this machine's address, or main_process_ip in multi"):
        rendezvous(launch, tmp_path)
    for wildcard in ("0.0.0.0", "::", "[::]"):  # an address no other machine can reach, and every interface's
        monkeypatch.setenv("VGRPO_HOST", wildcard)
        with pytest.raises(ConfigError, match=rf"VGRPO_HOST={re.escape(wildcard)}: give the address the other"):
            rendezvous(launch, tmp_path)


def test_machine_0_starts_the_others_on_its_job_and_a_lost_machine_fails_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VGRPO_HOST", "127.0.0.1")
    monkeypatch.delenv("VGRPO_STORE", raising=False)
    stage = _stage(**TWO_MACHINES)
    started: list[tuple[MachineJob, list[int]]] = []
    _fake_launch(monkeypatch, "import sys; print('the other machine hung up'); sys.exit(1)")
    with pytest.raises(MachinesLaunchFailed, match=r"(?s)exited with 1.*the other machine hung up"):
        launch_stage(
            stage,
            None,
            str(tmp_path / "run"),
            str(tmp_path),
            None,
            log=lambda line: None,
            start_machines=lambda job, ranks: started.append((job, list(ranks))),
        )
    ((job, ranks),) = started
    assert ranks == [1] and job.main_ip == "127.0.0.1" and job.run_root == "run" and job.stage == stage
    written = json.loads((tmp_path / "run" / "work" / "tiny" / "launch" / "machine-job.json").read_text())
    assert written == job.to_json() and MachineJob.from_json(written) == job
    lines: list[str] = []  # without a pool: the command each other machine runs
    with pytest.raises(MachinesLaunchFailed):
        launch_stage(stage, None, str(tmp_path / "run"), str(tmp_path), None, log=lines.append)
    assert any("python -m tasks.stage_machine" in line and "machine-job.json r" in line for line in lines)


def test_machine_r_refuses_a_bad_rank_or_a_missing_starting_adapter_before_launching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tasks.stage_machine import run_machine
    from vgrpo.errors import UserError

    monkeypatch.delenv("VGRPO_STORE", raising=False)
    monkeypatch.setattr("tasks.stage_machine.run_launcher", lambda *a, **k: pytest.fail("launched"))
    job = MachineJob.from_this_machine(_stage(**TWO_MACHINES), None, None, str(tmp_path / "run"), str(tmp_path), "h", 1)
    with pytest.raises(UserError, match=r"machine 1 landed on the worker that runs machine 0"):
        run_machine(job, 1, str(tmp_path))
    job = dataclasses.replace(job, machine_0="another-host:/srv/vgrpo")
    with pytest.raises(UserError, match=r"machine rank 2: stage tiny's other machines are 1..1"):
        run_machine(job, 2, str(tmp_path))
    job = dataclasses.replace(job, init_lora="run/stages/s0", init_hash="abc")
    with pytest.raises(UserError, match=r"its starting adapter .*run/stages/s0 is not on this machine"):
        run_machine(job, 1, str(tmp_path))

"""The one batch check (vgrpo.config_batch.check_batch): its message for each way a batch fails to split, and
the same message from every place that checks at load time."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.tiny_world import tiny_stage_config
from vgrpo.config import StageConfig, load_config, load_stage
from vgrpo.config_batch import check_batch
from vgrpo.errors import ConfigError
from vgrpo.parallel.distributed import Distributed

CASES = [
    # (prompts_per_iteration, group_size, minibatches, processes), the message
    (
        (4, 3, 5, 1),
        "optim.minibatches=5 must divide the batch (rollout.prompts_per_iteration x rollout.group_size = 12)",
    ),
    ((6, 4, 1, 4), "rollout.prompts_per_iteration=6 must be divisible by the 4 processes"),
    (
        (4, 3, 4, 2),
        "optim.minibatches=4 must divide each of the 2 processes' 6 samples "
        "(rollout.prompts_per_iteration x rollout.group_size / processes)",
    ),
]


@pytest.mark.parametrize(("split", "message"), CASES)
def test_check_batch_names_the_key_and_the_numbers(split: tuple[int, int, int, int], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_batch(*split)
    assert str(caught.value) == message


def test_check_batch_returns_each_process_samples() -> None:
    assert check_batch(4, 3) == 12
    assert check_batch(8, 4, minibatches=2, processes=4) == 8
    assert check_batch(6) == 6


def _params(tmp_path: Path, prompts: int, group: int, minibatches: int, processes: int = 1) -> Path:
    data = tiny_stage_config().model_dump(mode="json")
    data["rollout"] |= {"prompts_per_iteration": prompts, "group_size": group}
    data["optim"] |= {"minibatches": minibatches}
    data["launch"] = {"processes": processes}
    path = tmp_path / "stage.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("split", "message"), CASES)
def test_every_load_time_check_gives_the_one_message(
    tmp_path: Path, split: tuple[int, int, int, int], message: str
) -> None:
    prompts, group, minibatches, processes = split
    with pytest.raises(ConfigError, match=re.escape(message)):  # a stage's, over the params' launch.processes
        load_config([_params(tmp_path, prompts, group, minibatches, processes)], schema=StageConfig)
    if processes == 1:  # a run's (TrainConfig)
        run = {
            "rollout": {"prompts_per_iteration": prompts, "group_size": group},
            "optim": {"minibatches": minibatches},
        }
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config([tmp_path / "run.yaml"])
    if processes > 1:  # the processes started (WORLD_SIZE), the params asking for one
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_stage([_params(tmp_path, prompts, group, minibatches)], world_size=processes)
    if minibatches == 1:  # a rank's block of the prompts
        dist = Distributed.__new__(Distributed)
        dist.rank, dist.world_size = 0, processes
        with pytest.raises(ValueError, match=re.escape(message)):
            dist.shard(prompts)

"""The sweep test's barrier reward (:mod:`tests.flows.rendezvous`) can fail: a party alone times out."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.flows.rendezvous import rendezvous
from vgrpo.rewards.registry import build_reward


def test_a_lone_party_times_out_naming_the_folder(tmp_path: Path) -> None:
    with pytest.raises(TimeoutError, match=r"1 of 2 processes arrived"):
        rendezvous([None], ["a"], [{}], folder=str(tmp_path / "meet"), parties=2, timeout_s=0.5)


def test_once_every_party_arrived_it_scores_zeros(tmp_path: Path) -> None:
    (tmp_path / "meet").mkdir()
    (tmp_path / "meet" / "1.arrived").touch()  # another process, already there
    assert rendezvous([None, None], ["a", "b"], [{}, {}], folder=str(tmp_path / "meet"), timeout_s=5) == [0.0, 0.0]
    reward = build_reward("tests.flows.rendezvous:rendezvous", {"folder": str(tmp_path / "meet")})
    assert reward is not None  # the registry accepts it as a reward function with options


def test_the_folder_is_required() -> None:
    with pytest.raises(ValueError, match="folder"):
        rendezvous([None], ["a"], [{}])

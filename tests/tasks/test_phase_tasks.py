"""Which failures the Prefect phases retry: transient reward-server faults only."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("prefect")

from tasks.phase_tasks import RETRIES, is_transient
from vgrpo.rewards.base import RewardError, TransientRewardError
from vgrpo.training.guards import NonFiniteError


class _FailedState:
    def __init__(self, exc: BaseException):
        self.exc = exc

    def result(self) -> Any:
        raise self.exc


@pytest.mark.parametrize(
    ("exc", "retried"),
    [
        (TransientRewardError("reward 'geneval_server': POST failed after 3 attempt(s); last: HTTP 503"), True),
        (RewardError("reward 'geneval_server': POST was refused (HTTP 400); not retried"), False),
        (NonFiniteError("reward/pickscore", {"count": 1}), False),
        (ValueError("bad input"), False),
    ],
)
def test_only_transient_reward_faults_are_retried(exc: BaseException, retried: bool) -> None:
    assert is_transient(None, None, _FailedState(exc)) is retried


def test_only_the_score_phase_retries() -> None:
    assert set(RETRIES) == {"score"}

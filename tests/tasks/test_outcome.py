"""tasks.outcome: a stage's outcome is a frozen value that survives the JSON it is written as (a launched stage's
result file, results.json), and a file that is not one is refused by name."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tasks.outcome import StageEvaluation, StageOutcome

HISTORY = ({"iteration": 0.0, "reward/total_mean": 0.25}, {"iteration": 1.0, "reward/total_mean": 0.5})
START = {"iteration": 0, "eval/ocr": 0.5}


def _outcome() -> StageOutcome:
    return StageOutcome(
        "s1",
        "runs/stages/s1",
        "0123456789abcdef",
        run_id="r",
        model_uri="models:/m/1",
        resumed_from=1,
        wall_s=12.5,
        history=HISTORY,
        skipped=1,
        evaluations=(START,),
    )


def test_an_outcome_round_trips_through_its_json() -> None:
    outcome = _outcome()
    written = json.loads(json.dumps(outcome.to_json()))
    assert StageOutcome.from_json(written) == outcome
    assert set(outcome.to_json(history=False)) == {f.name for f in dataclasses.fields(StageOutcome)} - {"history"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        outcome.hash = "other"  # type: ignore[misc]


def test_the_final_evaluation_is_appended_at_its_iteration() -> None:
    final = {"eval/ocr": 0.75, "eval/ocr_ci_low": 0.5, "eval/ocr_ci_high": 0.9}
    evaluated = _outcome().evaluated(StageEvaluation({"rewards": {}}, final, None), 3)
    assert evaluated.final_eval == final and evaluated.evaluations == (START, {"iteration": 3, **final})
    assert _outcome().evaluated(StageEvaluation(), 3) == _outcome()  # no evaluation prompts: nothing to add


def test_a_file_that_is_not_an_outcome_names_what_is_wrong() -> None:
    with pytest.raises(ValueError, match=r"missing fields \['hash'\], unknown fields \['hsah'\]"):
        StageOutcome.from_json({"name": "s1", "out_dir": "x", "hsah": "abc"})

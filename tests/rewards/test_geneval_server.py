"""Flow-GRPO's GenEval reward server client against a fake server (yifan123/reward-server protocol): scores are
what the fake computed, answers are unpickled only as plain containers, failures are named."""

from __future__ import annotations

import io
import os
import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.rewards.fake_server import (
    FAST,
    FakeServer,
    Respond,
    closed_port_url,
    uniform_images,
)
from vgrpo.rewards.base import RewardError
from vgrpo.rewards.geneval_server import GenEvalServerReward, restricted_loads
from vgrpo.rewards.registry import get_reward_class
from vgrpo.rewards.vlm import UnifiedReward


def fake_geneval_answer(request: dict[str, Any]) -> dict[str, Any]:
    """Scores from the request: partial = mean pixel / 255, strict = counting tag, official rule = count == 1."""
    means = [float(np.asarray(Image.open(io.BytesIO(jpeg), formats=["jpeg"])).mean()) for jpeg in request["images"]]
    metas = request["meta_datas"]
    return {
        "scores": [m / 255 for m in means],
        "rewards": [0.0 if request["only_strict"] else float(meta["include"][0]["count"] == 1) for meta in metas],
        "strict_rewards": [1.0 if meta["tag"] == "counting" else 0.0 for meta in metas],
        "group_rewards": {"counting": [-10.0] * len(metas)},
        "group_strict_rewards": {"counting": [-10.0] * len(metas)},
    }


def fake_geneval(body: bytes, index: int) -> tuple[int, bytes]:
    return 200, pickle.dumps(fake_geneval_answer(pickle.loads(body)))


def geneval_metadata(n: int) -> list[dict[str, Any]]:
    tags = ["counting", "single_object", "color_attr"]
    return [
        {
            "tag": tags[i % 3],
            "include": [{"class": "cat", "count": 1 + i % 2}],
            "exclude": [{"class": "cat", "count": 3}],
            "prompt": "stale prompt in the file",
            "secret": "not for the server",
        }
        for i in range(n)
    ]


def test_geneval_server_scores_what_server_computed(serve: Callable[[Respond], FakeServer]) -> None:
    server = serve(fake_geneval)
    values = [0, 50, 100, 150, 200]
    prompts = [f"a photo of cat {i}" for i in range(5)]
    reward = GenEvalServerReward(base_url=server.url, only_strict=False, batch_size=2, **FAST)
    out = reward(uniform_images(values, side=16), prompts, geneval_metadata(5))
    np.testing.assert_allclose(out.scores, np.array(values) / 255, atol=2 / 255)  # JPEG round trip
    np.testing.assert_array_equal(out.sub_scores["partial"], out.scores)
    assert out.sub_scores["exact"].tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert out.sub_scores["strict"].tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert len(server.bodies) == 3 and set(server.paths) == {"/"}  # batches of 2, 2, 1
    requests_seen = [pickle.loads(body) for body in server.bodies]
    for request in requests_seen:
        assert set(request) == {"images", "meta_datas", "only_strict"} and request["only_strict"] is False
        for meta in request["meta_datas"]:
            assert set(meta) == {"tag", "include", "exclude", "prompt"}  # no "secret"
    assert [m["prompt"] for r in requests_seen for m in r["meta_datas"]] == prompts


def test_geneval_server_only_strict_omits_official_rule_and_trains_on_choice(
    serve: Callable[[Respond], FakeServer],
) -> None:
    server = serve(fake_geneval)
    reward = GenEvalServerReward(base_url=server.url, reward="exact", **FAST)
    out = reward(uniform_images([255, 0, 0]), ["a", "b", "c"], geneval_metadata(3))
    assert out.scores.tolist() == [1.0, 0.0, 0.0] and set(out.sub_scores) == {"partial", "exact"}
    assert pickle.loads(server.bodies[0])["only_strict"] is True


def test_geneval_server_refuses_pickle_with_global(serve: Callable[[Respond], FakeServer], tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {marker}",))

    payload = pickle.dumps({"scores": Exploit()})
    server = serve(lambda body, index: (200, payload))
    with pytest.raises(RewardError, match=r"not an allowed pickle.*global '(posix|os|nt)\.system' is not allowed"):
        GenEvalServerReward(base_url=server.url, **FAST)(uniform_images([1]), ["x"], geneval_metadata(1))
    assert not marker.exists() and len(server.bodies) == 1


def test_geneval_server_refuses_numpy_answer(serve: Callable[[Respond], FakeServer]) -> None:
    payload = pickle.dumps({"scores": np.array([0.5]), "strict_rewards": [1.0]})
    server = serve(lambda body, index: (200, payload))
    with pytest.raises(RewardError, match=r"global 'numpy\..*' is not allowed"):
        GenEvalServerReward(base_url=server.url, **FAST)(uniform_images([1]), ["x"], geneval_metadata(1))


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (b"garbage, not a pickle", r"not an allowed pickle"),
        (b"", r"not an allowed pickle"),
        (pickle.dumps([0.5]), r"answered list, expected a dict"),
        (pickle.dumps({"strict_rewards": [1.0]}), r"'scores' that is not a list of 1 numbers: None"),
        (pickle.dumps({"scores": [0.5, 0.5], "strict_rewards": [1.0]}), r"'scores' that is not a list of 1"),
        (pickle.dumps({"scores": ["0.5"], "strict_rewards": [1.0]}), r"'scores' that is not a list of 1"),
    ],
    ids=["garbage", "empty", "not-dict", "no-scores", "wrong-length", "strings"],
)
def test_geneval_server_malformed_answer_raises_without_retry(
    serve: Callable[[Respond], FakeServer], answer: bytes, message: str
) -> None:
    server = serve(lambda body, index: (200, answer))
    with pytest.raises(RewardError, match=message):
        GenEvalServerReward(base_url=server.url, **FAST)(uniform_images([1]), ["x"], geneval_metadata(1))
    assert len(server.bodies) == 1


def test_geneval_server_500_traceback_retried_then_reported(serve: Callable[[Respond], FakeServer]) -> None:
    server = serve(lambda body, index: (500, b"Traceback (most recent call last):\n  KeyError: 'tag'"))
    with pytest.raises(RewardError, match=r"'geneval_server'.*after 2 attempt.*HTTP 500: Traceback"):
        GenEvalServerReward(base_url=server.url, attempts=2, **FAST)(uniform_images([1]), ["x"], geneval_metadata(1))
    assert len(server.bodies) == 2


def test_geneval_server_server_down_fails_fast() -> None:
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"ConnectionError"):
        GenEvalServerReward(base_url=closed_port_url(), attempts=2, **FAST)(
            uniform_images([1]), ["x"], geneval_metadata(1)
        )
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize("url", ["http://10.0.0.5:18085", "http://0.0.0.0:18085", "https://geneval.example.org"])
def test_geneval_server_off_this_machines_loopback_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match=r"is not this machine's loopback; Flow-GRPO's GenEval server unpickles"):
        GenEvalServerReward(base_url=url)
    assert GenEvalServerReward(base_url="http://localhost:18085").client.base_url == "http://localhost:18085"


def test_geneval_server_metadata_required_and_checked() -> None:
    reward = GenEvalServerReward(base_url=closed_port_url())
    with pytest.raises(ValueError, match="needs per-image metadata"):
        reward(uniform_images([1]), ["x"])
    with pytest.raises(ValueError, match="'tag' and 'include'"):
        reward(uniform_images([1]), ["x"], [{"include": []}])
    with pytest.raises(ValueError, match="not plain JSON"):
        reward(uniform_images([1]), ["x"], [{"tag": "counting", "include": [object()]}])


def test_restricted_loads_accepts_plain_containers_every_protocol() -> None:
    answer = {"scores": [0.5, 1, True], "group_rewards": {"counting": [-10.0]}, "t": (None, "s")}
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert restricted_loads(pickle.dumps(answer, protocol=protocol)) == answer
    assert restricted_loads(pickle.dumps([b"jpeg"], protocol=3)) == [b"jpeg"]  # bytes need protocol >= 3


def test_registry_resolves_remote_rewards() -> None:
    assert get_reward_class("unifiedreward") is UnifiedReward
    assert get_reward_class("geneval_server") is GenEvalServerReward

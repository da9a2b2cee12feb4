"""The VLM judge (UnifiedReward) against a fake OpenAI-compatible server: scores are what the fake computed from
the request; failures are bounded and named."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import numpy as np
import pytest

from tests.rewards.fake_server import (
    FAST,
    FakeServer,
    Respond,
    chat_answer,
    closed_port_url,
    decode_chat,
    fake_judge,
    judge_value,
    uniform_images,
)
from vgrpo.rewards.base import RewardError, TransientRewardError
from vgrpo.rewards.vlm import UnifiedReward, VLMJudge


def test_unifiedreward_fake_judge_scores_what_server_computed(serve: Callable[[Respond], FakeServer]) -> None:
    server = serve(fake_judge)
    values = [0, 64, 128, 191, 255]
    prompts = [f"a photo of {i} cats [with {{braces}}]" for i in range(5)]
    out = UnifiedReward(base_url=server.url, **FAST)(uniform_images(values), prompts)
    expected = np.array([judge_value(v) for v in values], dtype=np.float64)
    np.testing.assert_array_equal(out.sub_scores["raw"], expected)
    np.testing.assert_allclose(out.scores, expected / 5)
    np.testing.assert_array_equal(out.sub_scores["fallback"], np.zeros(5))
    requests_seen = [decode_chat(body) for body in server.bodies]
    assert sorted(caption for _, _, caption in requests_seen) == sorted(prompts)  # prompts arrive intact
    for request, image, _ in requests_seen:
        assert set(request) == {"model", "messages", "temperature", "max_tokens"}  # nothing else is sent
        assert request["model"] == "UnifiedReward-7b-v1.5" and request["temperature"] == 0
        assert image.shape == (512, 512, 3)  # Flow-GRPO resizes to 512x512
    assert set(server.paths) == {"/v1/chat/completions"}
    assert all("Authorization" not in h and "Cookie" not in h for h in server.headers)


def test_vlm_judge_without_resize_sends_images_intact(serve: Callable[[Respond], FakeServer]) -> None:
    server = serve(fake_judge)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(3, 6, 5, 3), dtype=np.uint8)
    judge = VLMJudge(base_url=server.url, model="m", prompt_template="Text Caption: [{prompt}]", **FAST)
    out = judge(images, ["a", "b", "c"])
    received = {caption: image for _, image, caption in map(decode_chat, server.bodies)}
    for image, prompt in zip(images, "abc", strict=True):
        np.testing.assert_array_equal(received[prompt], image)
    np.testing.assert_array_equal(out.sub_scores["raw"], [judge_value(image.mean()) for image in images])


def test_vlm_judge_api_key_env_sends_bearer_header(
    serve: Callable[[Respond], FakeServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = serve(fake_judge)
    monkeypatch.setenv("VGRPO_TEST_JUDGE_KEY", "sekrit")
    UnifiedReward(base_url=server.url, api_key_env="VGRPO_TEST_JUDGE_KEY", **FAST)(uniform_images([9]), ["x"])
    assert server.headers[0]["Authorization"] == "Bearer sekrit"


def test_vlm_judge_slow_server_times_out_after_bounded_retries(serve: Callable[[Respond], FakeServer]) -> None:
    def slow(body: bytes, index: int) -> tuple[int, bytes]:
        time.sleep(1.5)
        return fake_judge(body, index)

    server = serve(slow)
    judge = UnifiedReward(base_url=server.url, **{**FAST, "read_timeout": 0.2}, attempts=2)
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"'unifiedreward'.*127\.0\.0\.1.*after 2 attempt.*Timeout"):
        judge(uniform_images([1]), ["x"])
    assert time.monotonic() - start < 1.5
    assert len(server.bodies) == 2


def test_vlm_judge_transient_503_retried_then_succeeds(serve: Callable[[Respond], FakeServer]) -> None:
    def flaky(body: bytes, index: int) -> tuple[int, bytes]:
        return (503, b"overloaded") if index < 2 else fake_judge(body, index)

    server = serve(flaky)
    out = UnifiedReward(base_url=server.url, attempts=3, **FAST)(uniform_images([255]), ["x"])
    assert out.scores.tolist() == [1.0] and len(server.bodies) == 3


def test_vlm_judge_503_every_time_names_last_status(serve: Callable[[Respond], FakeServer]) -> None:
    server = serve(lambda body, index: (503, b"still overloaded"))
    with pytest.raises(TransientRewardError, match=r"after 3 attempt.*HTTP 503: still overloaded"):
        UnifiedReward(base_url=server.url, attempts=3, **FAST)(uniform_images([1]), ["x"])
    assert len(server.bodies) == 3


def test_vlm_judge_400_not_retried(serve: Callable[[Respond], FakeServer]) -> None:
    server = serve(lambda body, index: (400, b'{"error": "bad image"}'))
    with pytest.raises(RewardError, match=r"refused \(HTTP 400: .*bad image.*not retried") as refused:
        UnifiedReward(base_url=server.url, attempts=5, **FAST)(uniform_images([1]), ["x"])
    assert not isinstance(refused.value, TransientRewardError)  # a refusal is not worth retrying later
    assert len(server.bodies) == 1


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (chat_answer("A lovely picture, I would say four."), r"no 'Final Score:' <number> in the answer 'A lovely"),
        (chat_answer("Final Score: 7"), r"score 7.0 outside \[1.0, 5.0\]"),
        (chat_answer("Final Score: 0"), r"score 0.0 outside"),
        (b"<html>502 Bad Gateway</html>", r"not JSON: '<html>502"),
        (json.dumps({"choices": []}).encode(), r"no choices\[0\]\.message\.content"),
        (json.dumps({"object": "error", "message": "oops"}).encode(), r"no choices.*oops"),
        (json.dumps({"choices": [{"message": {"content": None}}]}).encode(), r"not text"),
    ],
    ids=["no-score", "above-range", "below-range", "not-json", "no-choices", "error-object", "null-content"],
)
def test_vlm_judge_malformed_answer_raises_without_retry(
    serve: Callable[[Respond], FakeServer], answer: bytes, message: str
) -> None:
    server = serve(lambda body, index: (200, answer))
    with pytest.raises(RewardError, match=message):
        UnifiedReward(base_url=server.url, **FAST)(uniform_images([1]), ["x"])
    assert len(server.bodies) == 1


def test_vlm_judge_answer_truncated_in_error(serve: Callable[[Respond], FakeServer]) -> None:
    server = serve(lambda body, index: (200, chat_answer("blah " * 1000)))
    with pytest.raises(RewardError, match=r"more chars") as info:
        UnifiedReward(base_url=server.url, **FAST)(uniform_images([1]), ["x"])
    assert len(str(info.value)) < 500


def test_vlm_judge_fallback_score_replaces_malformed_answer(serve: Callable[[Respond], FakeServer]) -> None:
    def mixed(body: bytes, index: int) -> tuple[int, bytes]:
        _, image, _ = decode_chat(body)
        return 200, chat_answer("Final Score: 4" if image.mean() > 100 else "no idea")

    server = serve(mixed)
    out = UnifiedReward(base_url=server.url, fallback_score=0.0, max_concurrency=1, **FAST)(
        uniform_images([200, 10]), ["a", "b"]
    )
    assert out.scores.tolist() == [0.8, 0.0]
    assert out.sub_scores["fallback"].tolist() == [0.0, 1.0]


def test_vlm_judge_server_down_fails_fast() -> None:
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"'unifiedreward'.*after 2 attempt.*ConnectionError"):
        UnifiedReward(base_url=closed_port_url(), attempts=2, **FAST)(uniform_images([1]), ["x"])
    assert time.monotonic() - start < 2.0

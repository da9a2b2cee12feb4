"""The shared HTTP client of the remote rewards: its concurrency limit, its configuration errors, and the
options each remote reward passes to it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from tests.rewards.fake_server import (
    FAST,
    FakeServer,
    Respond,
    fake_judge,
    uniform_images,
)
from vgrpo.rewards.geneval_server import GenEvalServerReward
from vgrpo.rewards.http import HTTPClient, HTTPOptions
from vgrpo.rewards.registry import build_reward
from vgrpo.rewards.vlm import UnifiedReward, VLMJudge


def test_http_client_concurrency_limit_holds_across_threads(serve: Callable[[Respond], FakeServer]) -> None:
    def slow(body: bytes, index: int) -> tuple[int, bytes]:
        time.sleep(0.15)
        return fake_judge(body, index)

    server = serve(slow)
    judge = VLMJudge(
        base_url=server.url, model="m", prompt_template="Text Caption: [{prompt}]", max_concurrency=3, **FAST
    )
    images = uniform_images(list(range(0, 240, 20)))  # 12 images
    results: list[np.ndarray] = []
    callers = [threading.Thread(target=lambda: results.append(judge(images, ["p"] * 12).scores)) for _ in range(2)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert len(results) == 2 and len(server.bodies) == 24
    assert 2 <= server.max_in_flight <= 3


def test_http_client_rejects_bad_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="http://"):
        HTTPClient("r", HTTPOptions("127.0.0.1:80"))
    with pytest.raises(ValueError, match="attempts"):
        HTTPClient("r", HTTPOptions("http://127.0.0.1:80", attempts=0))
    with pytest.raises(ValueError, match="timeouts"):
        HTTPClient("r", HTTPOptions("http://127.0.0.1:80", read_timeout=0))
    monkeypatch.delenv("VGRPO_TEST_UNSET_KEY", raising=False)
    with pytest.raises(ValueError, match="'VGRPO_TEST_UNSET_KEY' is not set"):
        HTTPClient("r", HTTPOptions("http://127.0.0.1:80", api_key_env="VGRPO_TEST_UNSET_KEY"))
    with pytest.raises(ValueError, match="placeholder"):
        VLMJudge(model="m", prompt_template="no placeholder")


@pytest.mark.parametrize("url", ["http://10.0.0.5:8000", "http://judge.internal", "http://127.0.0.1.evil.com"])
def test_an_api_key_is_never_sent_in_clear_text_to_another_host(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("VGRPO_TEST_KEY", "sk-test-123456")
    with pytest.raises(ValueError, match=r"api_key_env would send the key in clear text to http://"):
        HTTPClient("r", HTTPOptions(url, api_key_env="VGRPO_TEST_KEY"))
    for fine in (
        url.replace("http://", "https://"),
        "http://127.0.0.1:8000",
        "http://localhost:8000",
        "http://[::1]:80",
    ):
        assert HTTPClient("r", HTTPOptions(fine, api_key_env="VGRPO_TEST_KEY")).headers["Authorization"].endswith("456")
    assert HTTPClient("r", HTTPOptions(url)).headers == {}  # no key: plain http to any host, as before


@pytest.mark.parametrize("name", ["unifiedreward", "geneval_server"])
def test_remote_rewards_pass_params_options_to_one_http_options(name: str) -> None:
    options = {"base_url": "http://127.0.0.1:9/", "read_timeout": 7.0, "attempts": 2, "max_concurrency": 3}
    client = build_reward(name, options).client
    assert client.options == HTTPOptions(**options)
    assert client.base_url == "http://127.0.0.1:9" and client.timeout == (5.0, 7.0)
    with pytest.raises(TypeError, match=r"bad options.*read_timout"):
        build_reward(name, {"read_timout": 7.0})


def test_remote_rewards_default_servers() -> None:
    assert UnifiedReward().client.options == HTTPOptions("http://127.0.0.1:17140", max_concurrency=16)
    assert GenEvalServerReward().client.options == HTTPOptions("http://127.0.0.1:18085", max_concurrency=1)

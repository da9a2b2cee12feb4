"""The remote reward clients against fake servers on 127.0.0.1: an OpenAI-compatible VLM and Flow-GRPO's GenEval
server. Scores must be what the fake computed from the request; failures must be bounded and named."""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from vgrpo.rewards.base import RewardError, TransientRewardError
from vgrpo.rewards.geneval_server import GenEvalServerReward, restricted_loads
from vgrpo.rewards.http import HTTPClient, HTTPOptions
from vgrpo.rewards.registry import build_reward, get_reward_class
from vgrpo.rewards.vlm import UnifiedReward, VLMJudge

Respond = Callable[[bytes, int], tuple[int, bytes]]  # (body, request index) -> (status, answer)
FAST = {"connect_timeout": 1.0, "read_timeout": 2.0, "base_delay": 0.01, "max_delay": 0.05}


class FakeServer:
    """A threaded HTTP server whose answers come from ``respond``; records requests and peak concurrency."""

    def __init__(self, respond: Respond):
        self.respond = respond
        self.lock = threading.Lock()
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with server.lock:
                    index = len(server.bodies)
                    server.bodies.append(body)
                    server.headers.append(dict(self.headers))
                    server.paths.append(self.path)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    status, answer = server.respond(body, index)
                finally:
                    with server.lock:
                        server.in_flight -= 1
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


@pytest.fixture
def serve() -> Iterator[Callable[[Respond], FakeServer]]:
    servers: list[FakeServer] = []

    def start(respond: Respond) -> FakeServer:
        servers.append(FakeServer(respond))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def uniform_images(values: list[int], side: int = 8) -> np.ndarray:
    """Grey images, image ``i`` filled with ``values[i]``: ``uint8 (N, side, side, 3)``."""
    return np.stack([np.full((side, side, 3), v, dtype=np.uint8) for v in values])


# ---- the fake OpenAI-compatible VLM ----


def decode_chat(body: bytes) -> tuple[dict[str, Any], np.ndarray, str]:
    """The request, its image and its caption, as the fake judge reads them."""
    request = json.loads(body)
    image_part, text_part = request["messages"][0]["content"]
    url = image_part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    image = np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB"))
    caption = text_part["text"].rsplit("Text Caption: [", 1)[1][:-1]
    return request, image, caption


def judge_value(mean: float) -> int:
    """The fake judge's score: 1..5 from the mean pixel value."""
    return 1 + round(mean / 255 * 4)


def chat_answer(text: str) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}).encode()


def fake_judge(body: bytes, index: int) -> tuple[int, bytes]:
    _, image, _ = decode_chat(body)
    return 200, chat_answer(f"The caption matches.\nFinal Score: {judge_value(image.mean())}")


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


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_vlm_judge_server_down_fails_fast() -> None:
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"'unifiedreward'.*after 2 attempt.*ConnectionError"):
        UnifiedReward(base_url=closed_port_url(), attempts=2, **FAST)(uniform_images([1]), ["x"])
    assert time.monotonic() - start < 2.0


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


# ---- the fake GenEval reward server (yifan123/reward-server protocol) ----


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

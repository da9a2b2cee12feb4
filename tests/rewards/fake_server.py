"""A threaded fake HTTP server on 127.0.0.1 for the remote reward clients' tests, and a fake OpenAI-compatible
VLM judge whose score is a known function of the image it was sent."""

from __future__ import annotations

import base64
import io
import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
from PIL import Image

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


def uniform_images(values: list[int], side: int = 8) -> np.ndarray:
    """Grey images, image ``i`` filled with ``values[i]``: ``uint8 (N, side, side, 3)``."""
    return np.stack([np.full((side, side, 3), v, dtype=np.uint8) for v in values])


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


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

"""Fixtures of the reward tests: fake HTTP servers on 127.0.0.1, closed at the test's end."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.rewards.fake_server import FakeServer, Respond


@pytest.fixture
def serve() -> Iterator[Callable[[Respond], FakeServer]]:
    servers: list[FakeServer] = []

    def start(respond: Respond) -> FakeServer:
        servers.append(FakeServer(respond))
        return servers[-1]

    yield start
    for server in servers:
        server.close()

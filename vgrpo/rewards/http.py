"""The HTTP machinery shared by the rewards that run behind a server (VLM judges, Flow-GRPO's GenEval server).

One :class:`HTTPClient` per reward, configured by one :class:`HTTPOptions` (the keyword options a remote reward
passes through from its params entry): POSTs a body to ``{base_url}{path}`` with a (connect, read) timeout,
retries with exponential backoff and jitter on what may pass (connection errors, timeouts, 429, 5xx), never on
what will not (other 4xx; a malformed answer is the caller's to reject), and keeps at most ``max_concurrency``
requests in flight across every thread that uses it. Every failure is a :class:`RewardError` that names the
reward, the URL and what happened.

Only the body the caller builds is sent: the session ignores the environment (``trust_env=False``), so no
``.netrc`` credentials or proxy settings of this process reach the server. An API key (``api_key_env``) goes only
over ``https://`` or to a loopback address: over plain ``http://`` to another host anyone on the path would read it.
"""

from __future__ import annotations

import ipaddress
import os
import random
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import requests

from vgrpo.rewards.base import RewardError, TransientRewardError

__all__ = ["DEFAULT_HOST", "HTTPClient", "HTTPOptions", "is_loopback_url", "truncate"]

DEFAULT_HOST = "127.0.0.1"


def is_loopback_url(url: str) -> bool:
    """Whether ``url``'s host is this machine's loopback (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


RETRY_STATUS = frozenset({429}) | frozenset(range(500, 600))
_RETRY_EXCEPTIONS = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)

T = TypeVar("T")
R = TypeVar("R")


def truncate(text: str | bytes, limit: int = 200) -> str:
    """``text`` (bytes decoded leniently) cut to ``limit`` characters, for error messages."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more chars]"


@dataclass(frozen=True)
class HTTPOptions:
    """How a reward reaches its server. A remote reward takes these as keyword options (``base_url``,
    ``read_timeout``, ... in its params entry) and hands them to its :class:`HTTPClient` unchanged.

    Args:
        base_url: ``http://host:port`` (a path prefix is kept); a trailing slash is ignored.
        connect_timeout: seconds to open the connection.
        read_timeout: seconds to wait for each read of the answer (a VLM or a detector batch is slow).
        attempts: requests made at most for one call (1 = no retry).
        base_delay: backoff before retry ``k`` (1-based) is ``min(max_delay, base_delay * 2**(k-1))``
            scaled by a uniform jitter in ``[0.5, 1]``; a ``Retry-After`` of seconds is honoured up to ``max_delay``.
        max_delay: the cap of one backoff, seconds.
        max_concurrency: requests in flight at most, across all threads using one client.
        api_key_env: name of an environment variable whose value is sent as ``Authorization: Bearer``
            (servers started with ``--api-key``); nothing is sent when ``None``. The key itself stays out of
            params files.
    """

    base_url: str
    connect_timeout: float = 5.0
    read_timeout: float = 120.0
    attempts: int = 5
    base_delay: float = 1.0
    max_delay: float = 30.0
    max_concurrency: int = 8
    api_key_env: str | None = None


class HTTPClient:
    """POSTs to one reward server with timeouts, bounded retries and a concurrency limit.

    Args:
        reward: the reward's registry name, quoted in every error.
        options: the server and how to reach it.

    Raises:
        ValueError: on options out of range, or an ``api_key_env`` that is not set or would go over plain
            ``http://`` to a host other than this machine's loopback.
    """

    def __init__(self, reward: str, options: HTTPOptions):
        if not options.base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"reward {reward!r}: base_url must start with http:// or https://, got {options.base_url!r}"
            )
        if options.attempts < 1 or options.max_concurrency < 1:
            raise ValueError(f"reward {reward!r}: attempts and max_concurrency must be >= 1")
        if options.connect_timeout <= 0 or options.read_timeout <= 0 or options.base_delay < 0 or options.max_delay < 0:
            raise ValueError(f"reward {reward!r}: timeouts must be > 0 and delays >= 0")
        self.headers: dict[str, str] = {}
        if options.api_key_env is not None:
            if options.api_key_env not in os.environ:
                raise ValueError(f"reward {reward!r}: environment variable {options.api_key_env!r} is not set")
            if options.base_url.startswith("http://") and not is_loopback_url(options.base_url):
                raise ValueError(
                    f"reward {reward!r}: api_key_env would send the key in clear text to {options.base_url}; use "
                    "https:// (or a server on this machine's loopback)"
                )
            self.headers["Authorization"] = f"Bearer {os.environ[options.api_key_env]}"
        self.reward = reward
        self.options = options
        self.base_url = options.base_url.rstrip("/")
        self.timeout = (options.connect_timeout, options.read_timeout)
        self._slots = threading.BoundedSemaphore(options.max_concurrency)
        self._local = threading.local()

    def _session(self) -> requests.Session:
        # one session per thread: requests does not promise a Session is thread-safe
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.trust_env = False  # no .netrc credentials or proxies from this process's environment
            self._local.session = session
        return session

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        max_delay = self.options.max_delay
        if retry_after is not None and retry_after.strip().isdigit():
            return min(max_delay, float(retry_after))
        return min(max_delay, self.options.base_delay * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)

    def post(self, path: str, body: bytes, content_type: str) -> bytes:
        """The body of a 2xx answer to ``POST {base_url}{path}``.

        Raises:
            RewardError: at once on a 4xx other than 429 (quoting the answer).
            TransientRewardError: after ``options.attempts`` tries on connection errors, timeouts, 429 and 5xx
                (naming the last status or exception).
        """
        url = self.base_url + path
        headers = {"Content-Type": content_type, **self.headers}
        last = "no attempt made"
        for attempt in range(1, self.options.attempts + 1):
            retry_after = None
            try:
                with self._slots:
                    response = self._session().post(url, data=body, headers=headers, timeout=self.timeout)
            except requests.exceptions.SSLError as exc:  # a ConnectionError, but retrying will not fix a certificate
                raise RewardError(f"reward {self.reward!r}: POST {url} failed: SSLError: {exc}") from exc
            except _RETRY_EXCEPTIONS as exc:
                last = f"{type(exc).__name__}: {truncate(str(exc))}"
            except requests.RequestException as exc:
                raise RewardError(f"reward {self.reward!r}: POST {url} failed: {type(exc).__name__}: {exc}") from exc
            else:
                if response.ok:
                    return response.content
                last = f"HTTP {response.status_code}: {truncate(response.content)}"
                if response.status_code not in RETRY_STATUS:
                    raise RewardError(f"reward {self.reward!r}: POST {url} was refused ({last}); not retried")
                retry_after = response.headers.get("Retry-After")
            if attempt < self.options.attempts:
                time.sleep(self._backoff(attempt, retry_after))
        raise TransientRewardError(
            f"reward {self.reward!r}: POST {url} failed after {self.options.attempts} attempt(s); last: {last}"
        )

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``[fn(item) for item in items]``, run on up to ``max_concurrency`` threads, in order.

        The first error is raised once the calls already running have ended; calls not yet started are cancelled.
        """
        if len(items) <= 1 or self.options.max_concurrency == 1:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(max_workers=min(self.options.max_concurrency, len(items))) as pool:
            futures: list[Future[R]] = [pool.submit(fn, item) for item in items]
            try:
                return [future.result() for future in futures]
            finally:
                for future in futures:
                    future.cancel()

"""What is wrong with a reward's settings before it is built: a server URL that is malformed (or, asked to connect,
unanswered), options its constructor or function refuses; and the leaves of its nested options, which the
preflight (:mod:`vgrpo.training.preflight`) opens as paths and URLs."""

from __future__ import annotations

import inspect
import socket
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from vgrpo.rewards.registry import function_problem, resolve_reward

__all__ = ["option_leaves", "options_problem", "url_problem"]


def url_problem(url: str, *, connect: bool = False, timeout: float = 3.0) -> str | None:
    """What is wrong with a reward server's URL: not ``http(s)://host[:port]``, or, with ``connect``, no server
    accepting a TCP connection there."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as exc:
        return f"not a well-formed URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "not a well-formed http(s)://host[:port] URL"
    if connect:
        try:
            socket.create_connection(
                (parts.hostname, port or (443 if parts.scheme == "https" else 80)), timeout
            ).close()
        except OSError as exc:
            return f"no server accepts a connection ({exc})"
    return None


def option_leaves(options: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, str, Any]]:
    """``(leaf key, dotted key, value)`` of every non-container entry of nested reward options."""
    for key, value in options.items():
        dotted = f"{prefix}.{key}"
        if isinstance(value, Mapping):
            yield from option_leaves(value, dotted)
        elif isinstance(value, list) and all(isinstance(v, Mapping) for v in value):
            for i, item in enumerate(value):
                yield from option_leaves(item, f"{dotted}[{i}]")
        else:
            yield str(key), dotted, value


def options_problem(reward: Any) -> str | None:
    """A reward class's constructor or a reward function refusing the options (a missing ``path``, a misspelt
    keyword)."""
    target = resolve_reward(reward.name)
    if not isinstance(target, type):
        return function_problem(target, reward.name, reward.options)
    try:
        inspect.signature(target).bind(**reward.options)
    except TypeError as exc:
        return f"reward {reward.name!r}: options {sorted(reward.options)}: {exc}"
    return None

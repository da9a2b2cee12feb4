"""The devices an ablation sweep's cells share: a Prefect global concurrency limit with one slot per GPU.

The sweep (:mod:`flows.sweep`) sets the limit to its ``devices``; each cell (a run of the curriculum flow,
:mod:`flows.curriculum`) holds one slot while it trains, so whatever serves or works the cells' deployment never
trains more cells at once than there are devices.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prefect import get_client
from prefect.concurrency.sync import concurrency

__all__ = ["DEVICE_LIMIT", "device_slot", "set_device_limit"]

DEVICE_LIMIT = "vgrpo-devices"
"""The global concurrency limit's name."""


@contextmanager
def device_slot() -> Iterator[None]:
    """Hold one slot of :data:`DEVICE_LIMIT` while a cell trains (no limit when the limit does not exist, as in
    a cell run outside a sweep)."""
    with concurrency(DEVICE_LIMIT, occupy=1, strict=False):
        yield


def set_device_limit(devices: int) -> None:
    """Create or resize :data:`DEVICE_LIMIT` to ``devices`` slots."""
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(DEVICE_LIMIT, devices)

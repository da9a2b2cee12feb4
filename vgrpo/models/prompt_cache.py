"""The prompt-embedding cache: each prompt's text-encoder outputs, kept in CPU memory under a byte budget.

The text encoders are frozen, so a prompt's embeddings never change within a run; a stage meets thousands of
distinct prompts, though, and SD3.5's are about 5.5 MB each in float32 (333 tokens x 4096). The cache keeps
the most recently used ones on the CPU and :class:`vgrpo.models.adapter.PipelineAdapter` moves each batch's rows
to the device, so the device holds one batch of embeddings, not the stage's prompt set.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["PromptEmbeddingCache", "entry_bytes"]

Embeddings = tuple[Tensor, ...]


def entry_bytes(tensors: Sequence[Tensor]) -> int:
    """Bytes of the tensors' elements (what an entry costs the cache's budget)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def _on_cpu(t: Tensor) -> Tensor:
    """``t`` detached, on the CPU, in storage of its own size (a row of a larger batch would pin the batch)."""
    t = t.detach().to("cpu")
    if not t.is_contiguous() or t.untyped_storage().nbytes() != entry_bytes([t]):
        t = t.clone(memory_format=torch.contiguous_format)
    return t


class PromptEmbeddingCache:
    """Least-recently-used map ``prompt -> embeddings`` (a tuple of tensors) in CPU memory, never holding more
    than ``max_bytes`` of tensor elements.

    Args:
        max_bytes: the budget; 0 keeps nothing. An entry larger than the whole budget is returned but not kept.
    """

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self.nbytes = 0
        self.hits = self.misses = self.evictions = 0
        self._entries: OrderedDict[str, Embeddings] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, prompt: object) -> bool:
        return prompt in self._entries

    def get(self, prompt: str) -> Embeddings | None:
        """The prompt's embeddings (now the most recently used), or ``None`` when they are not kept."""
        entry = self._entries.get(prompt)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(prompt)
        self.hits += 1
        return entry

    def put(self, prompt: str, embeddings: Sequence[Tensor]) -> Embeddings:
        """Keep CPU copies of ``embeddings`` for ``prompt``, evicting the least recently used entries until they
        fit; returns the CPU copies (kept or not)."""
        entry = tuple(_on_cpu(t) for t in embeddings)
        size = entry_bytes(entry)
        self.discard(prompt)
        if size > self.max_bytes:
            return entry
        while self.nbytes + size > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.nbytes -= entry_bytes(evicted)
            self.evictions += 1
        self._entries[prompt] = entry
        self.nbytes += size
        return entry

    def discard(self, prompt: str) -> None:
        """Forget ``prompt`` if it is kept."""
        entry = self._entries.pop(prompt, None)
        if entry is not None:
            self.nbytes -= entry_bytes(entry)

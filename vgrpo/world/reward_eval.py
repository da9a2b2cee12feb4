"""Held-out accuracy of the embedded world's learned reward models.

* CLIP: caption retrieval among hard-negative captions that each change one attribute (chance ``1 / (1 + k)``),
  the same as pairwise accuracy per changed attribute (chance 0.5), and in-batch image->text / text->image top-1
  (a repeated caption counts as a hit).
* Preference: pairwise accuracy on held-out (clean, degraded) pairs per degradation kind (chance 0.5).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vgrpo.world.clip import embed_images, embed_texts, pixel_values
from vgrpo.world.degrade import hard_negative
from vgrpo.world.prompts import Record, allowed_pairs, sample_metadata, scene_for
from vgrpo.world.render import render

__all__ = ["distinct_negatives", "evaluate_clip", "evaluate_preference", "preference_records"]


def distinct_negatives(caption: str, k: int, rng: np.random.Generator, tries: int = 50) -> list[tuple[str, str]]:
    """Up to ``k`` distinct ``(kind, caption')`` hard negatives of ``caption`` (fewer when it has fewer)."""
    found: dict[str, str] = {}
    for _ in range(tries):
        kind, neg = hard_negative(caption, rng)
        found.setdefault(neg, kind)
        if len(found) == k:
            break
    return [(kind, neg) for neg, kind in found.items()]


@torch.no_grad()
def evaluate_clip(
    model: Any,
    tokenizer: Any,
    records: Sequence[Record],
    *,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    size: int,
    seed: int,
    negatives: int,
    batch: int,
) -> dict[str, Any]:
    """Held-out accuracies of a world CLIP on the clean renders of ``records``' ground-truth scenes."""
    rng = np.random.default_rng(seed)
    captions = [str(md["prompt"]) for md, _ in records]
    tags = [str(md["tag"]) for md, _ in records]
    images = np.stack([render(scene, size) for _, scene in records])
    img = torch.cat(
        [embed_images(model, pixel_values(images[i : i + 256], mean, std)) for i in range(0, len(images), 256)]
    )
    txt = embed_texts(model, tokenizer, captions)
    pos = (img * txt).sum(-1)
    hits, chance, by_tag = [], [], defaultdict(list)
    by_kind: dict[str, list[bool]] = defaultdict(list)
    for i, caption in enumerate(captions):
        negs = distinct_negatives(caption, negatives, rng)
        neg_scores = embed_texts(model, tokenizer, [n for _, n in negs]) @ img[i]
        wins = (pos[i] > neg_scores).tolist()
        hits.append(all(wins))
        by_tag[tags[i]].append(all(wins))
        chance.append(1 / (1 + len(negs)))
        for (kind, _), win in zip(negs, wins, strict=True):
            by_kind[kind].append(win)
    i2t, t2i = [], []
    for start in range(0, len(captions) - batch + 1, batch):
        sl = slice(start, start + batch)
        sims = img[sl] @ txt[sl].T  # (batch images, batch captions)
        names = np.asarray(captions[sl.start : sl.stop])
        i2t += (names[sims.argmax(1).numpy()] == names).tolist()
        t2i += (names[sims.argmax(0).numpy()] == names).tolist()
    return {
        "retrieval_acc": float(np.mean(hits)),
        "retrieval_chance": float(np.mean(chance)),
        "retrieval_acc_per_tag": {t: float(np.mean(v)) for t, v in sorted(by_tag.items())},
        "pairwise_acc_per_attribute": {k: float(np.mean(v)) for k, v in sorted(by_kind.items())},
        "in_batch_i2t_top1": float(np.mean(i2t)) if i2t else float("nan"),
        "in_batch_t2i_top1": float(np.mean(t2i)) if t2i else float("nan"),
        "in_batch_size": batch,
        "images": len(records),
    }


@torch.no_grad()
def evaluate_preference(
    model: Any,
    tokenizer: Any,
    pairs: tuple[list[str], np.ndarray, np.ndarray, list[str]],
    *,
    mean: tuple[float, ...],
    std: tuple[float, ...],
) -> dict[str, Any]:
    """Pairwise accuracy (preferred scored strictly higher) overall and per degradation kind."""
    captions, good, bad, kinds = pairs
    txt = embed_texts(model, tokenizer, captions)
    s_good = (embed_images(model, pixel_values(good, mean, std)) * txt).sum(-1)
    s_bad = (embed_images(model, pixel_values(bad, mean, std)) * txt).sum(-1)
    wins = (s_good > s_bad).numpy()
    per_kind = {k: float(wins[[i for i, x in enumerate(kinds) if x == k]].mean()) for k in sorted(set(kinds))}
    return {"pair_acc": float(wins.mean()), "pair_acc_per_kind": per_kind, "pairs": len(captions)}


def preference_records(seed: int, n: int) -> list[Record]:
    """``n`` seeded ``preference``-tag prompts with their ground-truth scenes over all colour-shape pairs (the
    world's splits hold no preference captions)."""
    rng, every = np.random.default_rng(seed), allowed_pairs(())
    records: list[Record] = []
    for _ in range(n):
        md = sample_metadata(rng, "preference", every)
        records.append((md, scene_for(md, rng, every)))
    return records

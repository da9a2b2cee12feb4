"""Replay: earlier stages' prompts rolled out beside the stage's own as KL-only groups.

A curriculum stage that trains one skill (stage 5's text) drifts on the others, and a reference KL on the stage's
own batch (``algorithm.ref_kl_coef``) holds back exactly the change the stage is for: at a KL that retains the
other skills the stage's own reward goes flat. Replay moves the KL off the stage's prompts onto the skills to keep.
Each iteration draws ``replay.prompts_per_iteration`` prompts of ``replay.tags`` from the training prompt file
(every row of those tags equally likely, whatever ``prompt_tags`` keeps for the stage's own draw) and rolls them
out with the stage's own prompts, ``group_size`` samples each. Their groups are not scored: their advantage is 0,
so the policy term ignores them, and the advantages of the stage's own groups are those of the own groups alone.
The reference KL (``ref_kl_coef``, V-GRPO Eq. 16's x-space form to the stage's starting weights) is weighted per
sample: ``replay.tags[tag]`` on a replay sample of that tag, ``replay.own_weight`` on the stage's own samples
(0 by default: the KL falls on the replay only), so the loss's term is
``ref_kl_coef * mean_i(w_i * KL_i)`` over the whole batch.

Replay prompts follow the stage's own in the batch: of the ``B + R`` prompts the last ``R`` replay; a rank's block
of whole groups therefore holds its own samples first. The draw is a function of ``(seed, iteration)`` alone, so a
resumed stage replays what an uninterrupted one does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from vgrpo.config_base import FrozenConfig
from vgrpo.prompts import load_prompts
from vgrpo.rewards.base import Metadata
from vgrpo.seeding import derive_seed

__all__ = [
    "ReplayConfig",
    "ref_kl_weights",
    "replay_problem",
    "replay_rows",
    "sample_replay_rows",
    "unscored_replay",
]

REPLAY_STREAM = 3
"""The replay draw's stream of ``derive_seed(seed, iteration, stream)`` (0: the stage's prompts, 1: the
iteration's generator)."""


class ReplayConfig(FrozenConfig):
    """``replay:`` in a stage's params (module docstring). Needs an algorithm with a reference KL
    (``algorithm.name: vgrpo`` or ``naive_elbo`` with ``ref_kl_coef > 0``)."""

    prompts_per_iteration: int = Field(ge=1, le=4096, description="Replay prompts rolled out each iteration.")
    tags: dict[str, Annotated[float, Field(ge=0)]] = Field(
        min_length=1,
        description="tag -> the reference KL's weight on replay samples of that tag (a multiple of "
        "algorithm.ref_kl_coef); replay prompts are drawn from the training prompt file's rows of these tags.",
    )
    own_weight: float = Field(
        0.0, ge=0, description="The reference KL's weight on the stage's own samples; 0 = the KL falls on replay only."
    )


def replay_problem(replay: ReplayConfig, algorithm: Any) -> str | None:
    """Why ``replay`` cannot run with the algorithm config ``algorithm``, or None: it weights a reference KL that
    only V-GRPO (and its naive baseline) computes per sample, and one that is on."""
    if algorithm.name not in ("vgrpo", "naive_elbo"):
        return f"replay: weights V-GRPO's reference KL; algorithm.name={algorithm.name} has none"
    if not algorithm.ref_kl_coef > 0:
        return "replay: weights the reference KL; set algorithm.ref_kl_coef > 0 (the KL on replay samples)"
    return None


def replay_rows(replay: ReplayConfig, prompt_file: Path) -> list[dict[str, Any]]:
    """The rows of ``prompt_file`` whose tag ``replay.tags`` names.

    Raises:
        ValueError: naming the file and the tags no row has.
    """
    rows = load_prompts(prompt_file)
    present = sorted({str(r.get("tag")) for r in rows})
    absent = sorted(set(replay.tags) - set(present))
    if absent:
        raise ValueError(f"{prompt_file}: replay.tags {absent} name no prompt's tag (its tags: {present})")
    return [dict(r) for r in rows if r.get("tag") in replay.tags]


def sample_replay_rows(rows: Sequence[Metadata], count: int, seed: int, iteration: int) -> list[Metadata]:
    """``count`` replay rows for one iteration (without replacement when there are enough), from
    ``(seed, iteration)`` alone and apart from the stage's own draw."""
    rng = np.random.default_rng(derive_seed(seed, iteration, REPLAY_STREAM))
    idx = rng.choice(len(rows), size=count, replace=len(rows) < count)
    return [rows[int(i)] for i in idx]


def ref_kl_weights(replay: ReplayConfig, replay_tags: Sequence[str], own_prompts: int, group_size: int) -> Tensor:
    """The reference KL's weight of every sample of the global batch, ``((own_prompts + R) * group_size,)``: the
    stage's own samples ``own_weight``, each replay sample its tag's weight (``replay_tags``: the ``R`` replay
    prompts' tags, in batch order)."""
    per_prompt = [replay.own_weight] * own_prompts + [replay.tags[tag] for tag in replay_tags]
    return torch.tensor(per_prompt, dtype=torch.float32).repeat_interleave(group_size)


def unscored_replay(scores: Mapping[str, Tensor], keys: Sequence[str], samples: int) -> dict[str, Tensor]:
    """A rank's ``samples`` scores under every reward of ``keys``: ``scores`` of its own samples (which lead its
    block), then NaN, a group no reward scores, on its replay samples."""
    nan = torch.full((samples,), float("nan"))
    return {key: torch.cat([scores[key], nan[len(scores[key]) :]]) if key in scores else nan for key in keys}

"""Client of Flow-GRPO's GenEval reward server: Mask2Former + CLIP colour behind HTTP.

GenEval (Ghosh et al. 2023) as Flow-GRPO (Liu et al. 2025) serves it for training. The protocol, from
yifan123/reward-server (``app_geneval.py``, ``reward_server/gen_eval.py``) and its client in yifan123/flow_grpo
(``flow_grpo/rewards.py``, ``geneval_score``): ``POST /`` whose body is a pickled dict

    {"images": [JPEG bytes, ...], "meta_datas": [{"tag", "include", "exclude"?, "prompt"}, ...], "only_strict": bool}

answered (200) by a pickled dict of plain Python lists and dicts

    {"scores": [partial credit], "rewards": [GenEval rule, 0/1], "strict_rewards": [exact counts, 0/1],
     "group_rewards": {tag: [...]}, "group_strict_rewards": {tag: [...]}}

or (500) by a traceback in text. ``scores`` is the training reward (each count clause ``1 - |n - found| / n``,
colour and position 0/1, averaged over clauses); ``strict_rewards`` is 1 when every clause holds with exact
counts; ``rewards`` is the official GenEval rule, computed only when ``only_strict`` is false (all 0 otherwise).
``only_strict`` does not change ``scores``; it only skips the official-rule pass. ``group_*`` repeat these per tag
with -10 elsewhere and are not read here (the tag is in the metadata).

The server unpickles every request it receives, so whoever reaches its port runs code as its user: it must listen
on loopback only, one server per machine (docs/rewards.md). This client refuses a ``base_url`` that is not this
machine's loopback (``127.0.0.0/8``, ``::1``, ``localhost``). The answer is decoded with
:class:`RestrictedUnpickler`, which refuses every global: only builtin containers, numbers, strings and bytes load.
The server builds its lists from Python floats and bools (``compute_geneval``), so nothing it sends needs a global;
a numpy array in an answer is refused.
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal, NoReturn

import numpy as np
from PIL import Image

from vgrpo.rewards.base import HeadlineColumn, Metadata, RewardError, RewardOutput
from vgrpo.rewards.geneval import GenEvalBase
from vgrpo.rewards.http import DEFAULT_HOST, HTTPClient, HTTPOptions, is_loopback_url, truncate

__all__ = ["GenEvalServerReward", "RestrictedUnpickler", "restricted_loads"]

_UNPICKLE_ERRORS = (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError)


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that loads no global at all (no class, no function): network data cannot run code."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed (only builtin containers load)")


def restricted_loads(data: bytes) -> Any:
    """``pickle.loads`` through :class:`RestrictedUnpickler`."""
    return RestrictedUnpickler(io.BytesIO(data)).load()


def _jpeg(image: np.ndarray, quality: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


class GenEvalServerReward(GenEvalBase):
    """GenEval scored by Flow-GRPO's reward server (protocol in the module docstring).

    Args:
        base_url: the server, ``http://127.0.0.1:port`` (Flow-GRPO: port 18085), on this machine's loopback only;
            requests go to ``{base_url}/``.
        only_strict: the server's flag: skip the official GenEval rule (Flow-GRPO's training default, faster);
            when false the ``correct`` sub-score is returned too.
        reward: which answer is :attr:`RewardOutput.scores`: ``"partial"`` (``scores``, Flow-GRPO's training
            reward), ``"exact"`` (``strict_rewards``) or ``"strict"`` (``rewards``, the official GenEval rule;
            needs ``only_strict=False``).
        batch_size: images per request (Flow-GRPO: 64).
        jpeg_quality: the JPEG quality images are sent at (PIL's default 75, as Flow-GRPO).
        max_concurrency: requests in flight at most (one request per batch; Flow-GRPO sends them one at a time).
        http: the other options of :class:`vgrpo.rewards.http.HTTPOptions` (timeouts, retries, ``api_key_env``).

    Sub-scores, named as :class:`vgrpo.rewards.geneval.GenEvalReward` names them: ``partial`` and ``exact``, and
    ``strict`` (the official GenEval rule) when not ``only_strict``. Prompt rows are checked against Mask2Former's
    vocabulary (the server's detector); evaluation tables break ``strict`` and ``partial`` down by tag when the
    server sends ``strict`` (:class:`vgrpo.rewards.geneval.GenEvalBase`).
    """

    name: ClassVar[str] = "geneval_server"

    @classmethod
    def detector_name(cls, options: Mapping[str, Any]) -> Any:
        return "mask2former"

    @classmethod
    def headline_columns(cls, key: str, options: Mapping[str, Any]) -> tuple[HeadlineColumn, ...]:
        """GenEval's overall scores when the server sends the official rule (``only_strict=False``), else the mean."""
        if options.get("only_strict", True):
            return super(GenEvalBase, cls).headline_columns(key, options)  # Reward's: the mean
        return super().headline_columns(key, options)

    def __init__(
        self,
        *,
        base_url: str = f"http://{DEFAULT_HOST}:18085",
        only_strict: bool = True,
        reward: Literal["partial", "exact", "strict"] = "partial",
        batch_size: int = 64,
        jpeg_quality: int = 75,
        max_concurrency: int = 1,
        **http: Any,
    ):
        if reward not in ("partial", "exact", "strict"):
            raise ValueError(f"reward {self.name!r}: reward must be 'partial', 'exact' or 'strict', got {reward!r}")
        if reward == "strict" and only_strict:
            raise ValueError(f"reward {self.name!r}: reward='strict' (the official rule) needs only_strict=False")
        if batch_size < 1 or not 1 <= jpeg_quality <= 100:
            raise ValueError(f"reward {self.name!r}: need batch_size >= 1 and jpeg_quality in 1..100")
        if not is_loopback_url(base_url):
            raise ValueError(
                f"reward {self.name!r}: base_url {base_url} is not this machine's loopback; Flow-GRPO's GenEval server "
                "unpickles every request (whoever reaches it runs code): run one per machine, on 127.0.0.1"
            )
        self.client = HTTPClient(self.name, HTTPOptions(base_url, max_concurrency=max_concurrency, **http))
        self.only_strict = only_strict
        self.reward = reward
        self.batch_size = batch_size
        self.jpeg_quality = jpeg_quality

    def request_metadata(self, row: Metadata, prompt: str) -> dict[str, Any]:
        """What the server reads of one metadata row (``tag``, ``include``, ``exclude``) and the prompt, as
        plain JSON values; a ``ValueError`` naming what is missing or not JSON."""
        if "tag" not in row or "include" not in row:
            raise ValueError(f"reward {self.name!r}: GenEval metadata needs 'tag' and 'include', got {sorted(row)}")
        keep = {"tag": row["tag"], "include": row["include"], "prompt": prompt}
        if "exclude" in row:
            keep["exclude"] = row["exclude"]
        try:
            return dict(json.loads(json.dumps(keep)))
        except TypeError as exc:
            raise ValueError(f"reward {self.name!r}: GenEval metadata is not plain JSON: {exc}") from exc

    def _column(self, answer: dict[Any, Any], key: str, n: int, url: str) -> np.ndarray:
        values = answer.get(key)
        if not (isinstance(values, list) and len(values) == n and all(isinstance(v, int | float) for v in values)):
            raise RewardError(
                f"reward {self.name!r}: {url} answered {key!r} that is not a list of {n} numbers: "
                f"{truncate(repr(values))}"
            )
        return np.asarray(values, dtype=np.float64)

    def _score_batch(self, batch: tuple[np.ndarray, list[dict[str, Any]]]) -> dict[str, np.ndarray]:
        images, meta = batch
        request = {
            "images": [_jpeg(image, self.jpeg_quality) for image in images],
            "meta_datas": meta,
            "only_strict": self.only_strict,
        }
        body = self.client.post("/", pickle.dumps(request), "application/octet-stream")
        url = self.client.base_url + "/"
        try:
            answer = restricted_loads(body)
        except _UNPICKLE_ERRORS as exc:
            raise RewardError(
                f"reward {self.name!r}: {url} answered a body that is not an allowed pickle ({exc}): {truncate(body)!r}"
            ) from exc
        if not isinstance(answer, dict):
            raise RewardError(f"reward {self.name!r}: {url} answered {type(answer).__name__}, expected a dict")
        n = len(images)
        columns = {"partial": self._column(answer, "scores", n, url)}
        columns["exact"] = self._column(answer, "strict_rewards", n, url)
        if not self.only_strict:
            columns["strict"] = self._column(answer, "rewards", n, url)
        return columns

    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        """GenEval rewards of ``images`` (``uint8 (N, H, W, 3)``) under their ``metadata`` clauses."""
        if metadata is None:
            raise ValueError(f"reward {self.name!r} needs per-image GenEval metadata")
        meta = [self.request_metadata(row, prompt) for row, prompt in zip(metadata, prompts, strict=True)]
        starts = range(0, len(images), self.batch_size)
        batches = [(images[s : s + self.batch_size], meta[s : s + self.batch_size]) for s in starts]
        parts = self.client.map(self._score_batch, batches)
        columns = {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
        return RewardOutput(scores=columns[self.reward], sub_scores=columns)

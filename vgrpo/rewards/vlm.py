"""VLM judges behind an OpenAI-compatible chat-completions server (sglang, vLLM), and UnifiedReward.

One request per image: ``POST {base_url}/v1/chat/completions`` with the model name, one user message holding
the image (a base64 PNG data URL ``image_url`` part) and the question (a ``text`` part), ``temperature`` 0 and
``max_tokens``. The judge's answer is parsed for a number after a marker ("Final Score:"), checked against the
judge's range and divided by its maximum.

UnifiedReward follows Flow-GRPO (yifan123/flow_grpo, ``flow_grpo/rewards.py``, ``unifiedreward_score_sglang``)
and UnifiedReward's own sglang client (CodeGoat24/UnifiedReward, ``sglang_llava/sglang_inference.py``): the
same question, images resized to 512x512, model ``UnifiedReward-7b-v1.5``, score ``1..5`` divided by 5. They map
an answer without a score to 0; here it is an error unless ``fallback_score`` is set.
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from PIL import Image

from vgrpo.rewards.base import Metadata, Reward, RewardError, RewardOutput
from vgrpo.rewards.http import DEFAULT_HOST, HTTPClient, HTTPOptions, truncate

__all__ = ["UNIFIEDREWARD_PROMPT", "UnifiedReward", "VLMJudge", "png_data_url"]

# Verbatim from flow_grpo/rewards.py (unifiedreward_score_sglang), "<image>\n" prefix included.
UNIFIEDREWARD_PROMPT = (
    "<image>\nYou are given a text caption and a generated image based on that caption. Your task is to evaluate "
    "this image based on two key criteria:\n1. Alignment with the Caption: Assess how well this image aligns with "
    "the provided caption. Consider the accuracy of depicted objects, their relationships, and attributes as "
    "described in the caption.\n2. Overall Image Quality: Examine the visual quality of this image, including "
    "clarity, detail preservation, color accuracy, and overall aesthetic appeal.\nBased on the above criteria, "
    "assign a score from 1 to 5 after 'Final Score:'.\nYour task is provided as follows:\nText Caption: [{prompt}]"
)


def png_data_url(image: np.ndarray, size: int | None = None) -> str:
    """A ``uint8 (H, W, 3)`` image as a ``data:image/png;base64,...`` URL, first resized to ``size`` x ``size``
    (PIL's default resampling, as Flow-GRPO) when given."""
    pil = Image.fromarray(image)
    if size is not None:
        pil = pil.resize((size, size))
    buffer = io.BytesIO()
    pil.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


class VLMJudge(Reward):
    """A VLM asked one question per image that answers with ``<marker> <number>``.

    Args:
        model: the served model name the request names.
        prompt_template: the question; ``{prompt}`` is replaced by the image's prompt.
        marker: the text that precedes the score in the answer (the first occurrence is read).
        min_score, max_score: the judge's range; an answer outside it is malformed.
        normalize: divide the score by ``max_score`` (Flow-GRPO: UnifiedReward's 1..5 becomes 0.2..1).
        max_tokens: the answer's token budget.
        image_size: resize images to this square side before encoding; ``None`` sends them as they are.
        fallback_score: when set, a malformed answer (no score, out of range) scores this (in the judge's
            units, before ``normalize``) instead of raising; Flow-GRPO's behaviour is ``0.0``. Off by default.
            A broken server (non-JSON body, no ``choices``) always raises.
        base_url: the server, ``http://host:port``; requests go to ``{base_url}/v1/chat/completions``.
        max_concurrency: requests in flight at most (one request per image).
        http: the other options of :class:`vgrpo.rewards.http.HTTPOptions` (timeouts, retries, ``api_key_env``).

    Sub-scores: ``raw``, the judge's number (the fallback where one was used), and ``fallback``, 1 where the
    answer was malformed and ``fallback_score`` stood in.
    """

    name: ClassVar[str] = "vlm_judge"

    def __init__(
        self,
        *,
        model: str,
        prompt_template: str,
        marker: str = "Final Score:",
        min_score: float = 1.0,
        max_score: float = 5.0,
        normalize: bool = True,
        max_tokens: int = 512,
        image_size: int | None = None,
        fallback_score: float | None = None,
        base_url: str = f"http://{DEFAULT_HOST}:30000",
        max_concurrency: int = 16,
        **http: Any,
    ):
        if "{prompt}" not in prompt_template:
            raise ValueError(f"reward {self.name!r}: prompt_template has no '{{prompt}}' placeholder")
        if not min_score < max_score or (normalize and max_score <= 0):
            raise ValueError(f"reward {self.name!r}: need min_score < max_score (and max_score > 0 to normalize)")
        self.client = HTTPClient(self.name, HTTPOptions(base_url, max_concurrency=max_concurrency, **http))
        self.model = model
        self.prompt_template = prompt_template
        self.score_re = re.compile(re.escape(marker) + r"\s*\**\s*([-+]?\d+(?:\.\d+)?)")
        self.marker = marker
        self.min_score, self.max_score = min_score, max_score
        self.normalize = normalize
        self.max_tokens = max_tokens
        self.image_size = image_size
        self.fallback_score = fallback_score

    def request_body(self, image: np.ndarray, prompt: str) -> dict[str, Any]:
        """The chat-completions request for one image: the image, the question and the decoding settings."""
        question = self.prompt_template.replace("{prompt}", prompt)
        content = [
            {"type": "image_url", "image_url": {"url": png_data_url(image, self.image_size)}},
            {"type": "text", "text": question},
        ]
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "temperature": 0,
            "max_tokens": self.max_tokens,
        }

    def answer_text(self, body: bytes) -> str:
        """``choices[0].message.content`` of a chat-completions answer; a :class:`RewardError` otherwise."""
        try:
            answer = json.loads(body)
            content = answer["choices"][0]["message"]["content"]
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RewardError(f"reward {self.name!r}: the server's answer is not JSON: {truncate(body)!r}") from exc
        except (KeyError, IndexError, TypeError) as exc:
            raise RewardError(
                f"reward {self.name!r}: the answer has no choices[0].message.content: {truncate(body)!r}"
            ) from exc
        if not isinstance(content, str):
            raise RewardError(f"reward {self.name!r}: message content is not text: {truncate(body)!r}")
        return content

    def parse_score(self, text: str) -> float:
        """The judge's number after :attr:`marker`, in ``[min_score, max_score]``; a :class:`RewardError` otherwise."""
        match = self.score_re.search(text)
        if match is None:
            raise RewardError(f"reward {self.name!r}: no {self.marker!r} <number> in the answer {truncate(text)!r}")
        value = float(match.group(1))
        if not (math.isfinite(value) and self.min_score <= value <= self.max_score):
            raise RewardError(
                f"reward {self.name!r}: score {value} outside [{self.min_score}, {self.max_score}] "
                f"in the answer {truncate(text)!r}"
            )
        return value

    def _judge(self, item: tuple[np.ndarray, str]) -> tuple[float, bool]:
        body = json.dumps(self.request_body(*item)).encode("utf-8")
        text = self.answer_text(self.client.post("/v1/chat/completions", body, "application/json"))
        try:
            return self.parse_score(text), False
        except RewardError:
            if self.fallback_score is None:
                raise
            return self.fallback_score, True

    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        """The judge's scores of ``images`` (``uint8 (N, H, W, 3)``) against ``prompts``; ``metadata`` is unused."""
        results = self.client.map(self._judge, list(zip(images, prompts, strict=True)))
        raw = np.array([value for value, _ in results], dtype=np.float64)
        fallback = np.array([used for _, used in results], dtype=np.float64)
        scores = raw / self.max_score if self.normalize else raw
        return RewardOutput(scores=scores, sub_scores={"raw": raw, "fallback": fallback})


class UnifiedReward(VLMJudge):
    """UnifiedReward (CodeGoat24/UnifiedReward) served by sglang, scored as Flow-GRPO does (see the module docstring).

    Defaults follow Flow-GRPO: the server at port 17140, model ``UnifiedReward-7b-v1.5``, 512x512 images, the
    verbatim question :data:`UNIFIEDREWARD_PROMPT`, ``Final Score:`` in 1..5 divided by 5. Other arguments as
    :class:`VLMJudge`.
    """

    name: ClassVar[str] = "unifiedreward"

    def __init__(
        self,
        *,
        base_url: str = f"http://{DEFAULT_HOST}:17140",
        model: str = "UnifiedReward-7b-v1.5",
        prompt_template: str = UNIFIEDREWARD_PROMPT,
        image_size: int | None = 512,
        **kwargs: Any,
    ):
        super().__init__(
            base_url=base_url, model=model, prompt_template=prompt_template, image_size=image_size, **kwargs
        )

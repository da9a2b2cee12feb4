"""The ELBO surrogate of a sample's log-likelihood: the (negative) pretraining loss at one pair.

V-GRPO replaces ``log pi_theta(o_i | c)`` by ``mean_j s_ij`` with (V-GRPO Sec. 4; the variance reductions of Sec. 4.4)::

    s_ij = - mean_d (x0_hat(z_ij, t_j, c) - o_i)^2 / sg(max(mean_d |x0_hat - o_i|, 1e-5))
    z_ij = (1 - t_j) o_i + t_j eps_j

Techniques 3 and 4 are the two switches here: the prediction space (``x`` default; ``v`` and
``eps`` for the ablation) and self-normalisation by the detached mean absolute error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import Tensor

from vgrpo.flow import eps_from_velocity, interpolate, velocity_target, x0_from_velocity

__all__ = ["Prediction", "SurrogateTerms", "elbo_surrogate", "prediction_error"]

Prediction = Literal["x", "v", "eps"]


def prediction_error(*, v_pred: Tensor, x0: Tensor, eps: Tensor, t: Tensor, prediction: Prediction) -> Tensor:
    """Residual of the chosen prediction (V-GRPO Sec. 3), shape ``(N, *S)`` in float32.

    ``x``: ``x0_hat - x0`` (= ``-t (v_hat - v)``); ``v``: ``v_hat - v``;
    ``eps``: ``eps_hat - eps`` (= ``(1 - t)(v_hat - v)``).
    """
    v32, x032, eps32 = v_pred.float(), x0.float(), eps.float()
    z = interpolate(x032, eps32, t.float())
    if prediction == "x":
        return x0_from_velocity(z, v32, t.float()) - x032
    if prediction == "v":
        return v32 - velocity_target(x032, eps32)
    if prediction == "eps":
        return eps_from_velocity(z, v32, t.float()) - eps32
    raise ValueError(f"prediction must be 'x', 'v' or 'eps', got {prediction!r}")


@dataclass(frozen=True)
class SurrogateTerms:
    """Per-sample surrogate at one pair.

    Attributes:
        surrogate: ``(N,)`` ``s_ij`` (with gradient when ``v_pred`` has one), float32.
        x0_hat: ``(N, *S)`` the x-space prediction, for the KL to the behaviour policy (Eq. 16).
    """

    surrogate: Tensor
    x0_hat: Tensor


def elbo_surrogate(
    *,
    v_pred: Tensor,
    x0: Tensor,
    eps: Tensor,
    t: Tensor,
    prediction: Prediction = "x",
    self_normalize: bool = True,
    min_scale: float = 1e-5,
) -> SurrogateTerms:
    """V-GRPO surrogate ``s_ij``, V-GRPO Sec. 4 (weighted-ELBO / pretraining loss, negated).

    Args:
        v_pred: ``(N, *S)`` the model's velocity at ``z = (1 - t) x0 + t eps``.
        x0: ``(N, *S)`` the generated samples ``o_i`` (the action; no gradient flows into them).
        eps: ``(N, *S)`` the pair's noise.
        t: ``(N,)`` the pair's timesteps.
        prediction: residual space (technique 3).
        self_normalize: divide by ``sg(max(mean_d |residual|, min_scale))`` (technique 4).
    """
    x0 = x0.detach()
    err = prediction_error(v_pred=v_pred, x0=x0, eps=eps, t=t, prediction=prediction)
    dims = tuple(range(1, err.ndim))
    s = -(err**2).mean(dim=dims)
    if self_normalize:
        s = s / err.detach().abs().mean(dim=dims).clamp(min=min_scale)
    z = interpolate(x0.float(), eps.float(), t.float())
    return SurrogateTerms(surrogate=s, x0_hat=x0_from_velocity(z, v_pred.float(), t.float()))

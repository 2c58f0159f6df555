"""Output heads that give a logit and its uncertainty (METHODS.md section 3), over pooled backbone features h.

- ``RandomFeatureGPHead`` (``sngp``): a Laplace-approximated random-feature Gaussian process.
  phi = sqrt(2/D) cos(W h + b) with W ~ N(0, sigma^2), b ~ U(0, 2 pi) frozen; logit g = w . phi + c. (The
  output layer is parametrised on the unscaled cosines, w' = w sqrt(2/D): the same functions, but under Adam
  the sqrt(2/D) factor slowed its learning so much that a PM on a small backbone stayed at chance.)
  After training, one pass over the training features accumulates the precision ridge*I + Phi^T Phi, and
  var(h) = ridge * phi^T (ridge I + Phi^T Phi)^-1 phi: near 0 where training data was dense, near 1 far away.
- ``MCDropoutHead`` (``mc_dropout``): dropout on h before a linear layer, kept on at prediction; the
  variance of the logit over passes (the backbone runs once, only the cheap head is resampled).
- ``EnsembleHead`` (``ensemble``): independently initialised linear heads trained together; the variance of
  their logits. (Members share the backbone: an ensemble of whole models costs M times the training.)

Every head returns ``train_logits(h)`` (batch, members) for the loss and ``predict(h)`` -> (g, var); the
calibrated logit is ``g / sqrt(1 + lambda * var)``; ``pair_uncertainty`` turns (g, var) into the routing score.

Example:
    >>> head = RandomFeatureGPHead(in_dim=4, n_features=64, feature_scale=1.0, ridge=1e-3)
    >>> head.accumulate(torch.zeros(10, 4)); head.finalize()
    >>> g, var = head.predict(torch.stack([torch.zeros(4), 5 * torch.ones(4)]))
    >>> bool(var[0] < var[1])
    True
"""
from __future__ import annotations

import math

import torch
from torch import nn


def calibrated_logit(g: torch.Tensor, var: torch.Tensor, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(g / u, u) with u = sqrt(1 + lambda * var)."""
    u = torch.sqrt(1 + lam * var)
    return g / u, u


def pair_uncertainty(g: torch.Tensor, var: torch.Tensor, lam: float, score: str) -> torch.Tensor:
    """The uncertainty that ranks pairs for routing.

    - ``variance``: u = sqrt(1 + lambda var), the paper's score (the GP variance alone).
    - ``predictive``: 1 - |2 sigmoid(g / u) - 1|, the uncertainty of the mean-field calibrated prediction that
      SNGP itself reports (1 at p = 1/2, 0 at p = 0 or 1): high where the logit is small or the variance shrinks
      it. On this task the variance alone grows with the feature norm and so with |g| (Spearman +0.48 on the
      benchmark), which made it rank the PM's confident, correct pairs as the most uncertain.
    """
    g_cal, u = calibrated_logit(g, var, lam)
    if score == "variance":
        return u
    if score == "predictive":
        return 1 - (2 * torch.sigmoid(g_cal) - 1).abs()
    raise ValueError(f"unknown uncertainty score {score!r}; expected predictive or variance")


class RandomFeatureGPHead(nn.Module):
    def __init__(self, in_dim: int, n_features: int, feature_scale: float, ridge: float):
        super().__init__()
        self.ridge = ridge
        self.register_buffer("W", torch.randn(n_features, in_dim) * feature_scale)  # frozen: a buffer, not a parameter
        self.register_buffer("b", torch.rand(n_features) * 2 * math.pi)
        self.linear = nn.Linear(n_features, 1)
        self.register_buffer("precision", ridge * torch.eye(n_features))
        self.register_buffer("covariance", torch.eye(n_features) / ridge)

    def features(self, h: torch.Tensor) -> torch.Tensor:
        return math.sqrt(2 / self.W.shape[0]) * torch.cos(h.float() @ self.W.T + self.b)

    def train_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(self.features(h) * math.sqrt(self.W.shape[0] / 2))

    def reset_precision(self) -> None:
        self.precision.copy_(self.ridge * torch.eye(self.W.shape[0], device=self.W.device))

    @torch.no_grad()
    def accumulate(self, h: torch.Tensor) -> None:
        """Add a batch of training features to the precision matrix (call ``finalize`` after the last batch)."""
        phi = self.features(h).double()
        self.precision.add_((phi.T @ phi).to(self.precision.dtype))

    @torch.no_grad()
    def finalize(self) -> None:
        self.covariance.copy_(torch.linalg.inv(self.precision.double()).to(self.covariance.dtype))

    @torch.no_grad()
    def predict(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        phi = self.features(h)
        var = self.ridge * ((phi @ self.covariance) * phi).sum(-1)
        return self.train_logits(h).squeeze(-1), var.clamp_min(0)


class MCDropoutHead(nn.Module):
    def __init__(self, in_dim: int, dropout: float, n_samples: int):
        super().__init__()
        self.dropout, self.n_samples = dropout, n_samples
        self.linear = nn.Linear(in_dim, 1)

    def train_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(nn.functional.dropout(h.float(), self.dropout, training=self.training))

    @torch.no_grad()
    def predict(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        draws = torch.stack([self.linear(nn.functional.dropout(h.float(), self.dropout, training=True)).squeeze(-1)
                             for _ in range(self.n_samples)])
        return self.linear(h.float()).squeeze(-1), draws.var(0)


class EnsembleHead(nn.Module):
    def __init__(self, in_dim: int, n_members: int):
        super().__init__()
        self.members = nn.Linear(in_dim, n_members)  # one output per member: M independent linear heads

    def train_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.members(h.float())

    @torch.no_grad()
    def predict(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.members(h.float())
        return logits.mean(-1), logits.var(-1)


def build_head(estimator: str, in_dim: int, cfg) -> nn.Module:
    """The head for ``estimator`` (sngp | mc_dropout | ensemble) from a ``RewardModelParams``-like config."""
    if estimator == "sngp":
        return RandomFeatureGPHead(in_dim, cfg.random_features, cfg.feature_scale, cfg.ridge)
    if estimator == "mc_dropout":
        return MCDropoutHead(in_dim, cfg.dropout, cfg.mc_samples)
    if estimator == "ensemble":
        return EnsembleHead(in_dim, cfg.ensemble_size)
    raise ValueError(f"unknown estimator {estimator!r}; expected sngp, mc_dropout or ensemble")

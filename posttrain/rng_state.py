"""A ``random.Random``'s state as JSON-ready data and back, so a resumed run draws what the killed run would
have drawn. Kept apart from ``posttrain.checkpoints`` so pure algorithm modules (``posttrain.rollout``) can
save their sampler state without importing mlflow, safetensors or transformers."""

import random


def rng_state(rng: random.Random) -> list:
    """``rng``'s state as JSON-ready data, saved with a checkpoint (``set_rng_state`` restores it)."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def set_rng_state(rng: random.Random, saved: list) -> None:
    """Continue ``rng`` from a state ``rng_state`` saved: it then draws what the killed run would have drawn."""
    rng.setstate((saved[0], tuple(saved[1]), saved[2]))

"""Plain unit tests of the training code: no cloud, no cloudtrain."""

import math

from train import train


def test_fits_the_line() -> None:
    result = train(epochs=300, lr=0.1, seed=0)
    assert abs(result["w"] - 3.0) < 0.05 and abs(result["b"] - 1.0) < 0.05


def test_too_large_a_learning_rate_diverges() -> None:
    result = train(epochs=300, lr=5.0, seed=0)
    assert not math.isfinite(result["final_loss"]) or result["final_loss"] > 1.0

"""cloudtrain: run a training job on a GPU VM (or this machine) and bring the results home."""

__version__ = "0.1.0"

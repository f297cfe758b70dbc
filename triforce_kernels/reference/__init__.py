"""Naive PyTorch oracles: the executable spec. Same signatures as the public ops (minus
``backend``), simple and obviously right, computing in float32 or float64."""

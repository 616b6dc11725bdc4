"""Pure-functional Flax NNX model definitions."""

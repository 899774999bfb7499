"""Training: joint state, the pure train step, shardings, the host loop, checkpoints and run logging."""

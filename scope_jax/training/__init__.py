"""Training: run settings and checks, setup, the RL step and the loop around it, joint state, the pure train
step, shardings, checkpoints and run logging."""

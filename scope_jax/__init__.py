"""scope-jax: multi-turn agent / user-simulator RL in JAX, built to study simulator collapse."""

__version__ = "0.1.0"

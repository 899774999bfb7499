"""Which backend the XLA:CPU layout tricks are on (docs/models.md, "Layout tricks for XLA:CPU")."""

import jax


def xla_cpu_layouts() -> bool:
    """Whether the layout tricks for XLA:CPU are on (`decoder.weight_grad`, `Block.decode_step`'s barrier,
    `logprobs.head_weight_grad`, `logprobs.vocab_sums`, `logprobs.logits_bytes`, attention's row
    groups): they are selected by the default backend, so an accelerator runs the plain forms."""
    return jax.default_backend() == "cpu"

"""Model specs -> players: what plays each role, from a config string.

A spec is "tiny:SEED" (a tiny random word-level model over the environment's vocabulary), an HF folder,
a .gguf file, or a known name such as "smollm2-135m-instruct" (see scope_jax.models.from_pretrained).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import nnx

from scope_jax.models import init
from scope_jax.models.tiny import tiny_config, word_tokenizer

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def load_model(spec: str, *, words: tuple[str, ...] = (), dtype: str = "float32") -> tuple[nnx.GraphDef, Any, Any]:
    """(graphdef, params, tokenizer) of a model spec."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    if spec.startswith("tiny:"):
        tokenizer = word_tokenizer(words)
        graphdef, params = init(tiny_config(len(tokenizer)), seed=int(spec.split(":", 1)[1]),
                                param_dtype=DTYPES[dtype])
        return graphdef, params, tokenizer
    from scope_jax.models import from_pretrained

    _, (graphdef, params), tokenizer = from_pretrained(spec, dtype=DTYPES[dtype])
    return graphdef, params, tokenizer

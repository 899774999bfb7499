"""Model specs -> players: what plays each role, from a config string.

A spec is "tiny:SEED" (a tiny random word-level model over the environment's vocabulary), an HF folder,
a .gguf file, or a known name such as "smollm2-135m-instruct" (see scope_jax.models.from_pretrained); and
"BASE+ADAPTER" is the model BASE with the LoRA adapter saved in the folder ADAPTER (`models.lora`), e.g.
the P4G human proxy, "smollm2-135m-instruct+docs/results/p4g_proxy/adapter".
Every player's chat template runs with thinking off (see `scope_jax.models.tokenizer.without_thinking`).
"""

from __future__ import annotations

import os
from typing import Any, Iterable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from scope_jax import sharding
from scope_jax.config import ConfigError
from scope_jax.models import PARTITION_RULES, from_pretrained, init, lora
from scope_jax.models.hf import TOKENIZER_FILES, model_path
from scope_jax.models.tiny import tiny_config, word_tokenizer
from scope_jax.models.tokenizer import without_thinking

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def adapter_hashes(specs: Iterable[str]) -> dict[str, str]:
    """{spec: the sha256 of its adapter's weights file} of the base+adapter specs among `specs`."""
    return {spec: lora.adapter_sha256(spec.split("+", 1)[1]) for spec in specs if "+" in spec}


def check_specs(named: Iterable[tuple[str, str]]) -> None:
    """Raise ConfigError naming the first config key of `named` ((key, spec) pairs; an empty spec is
    skipped) whose spec names no model `load_model` could load, or an adapter folder that does not exist.
    Nothing is loaded."""
    for key, spec in named:
        if not spec:
            continue
        base, plus, adapter = spec.partition("+")
        if base.startswith("tiny:"):
            whole = base[len("tiny:"):].isdigit()
            problem = None if whole else "a tiny model is tiny:SEED, SEED a whole number"
        else:
            try:
                model_path(base)
                problem = None
            except FileNotFoundError as e:
                problem = str(e)
        if problem is None and plus and not os.path.isdir(adapter):
            problem = f"its adapter folder {adapter!r} does not exist"
        if problem:
            raise ConfigError(f"config key '{key}' is {spec!r}; {problem}")


def load_model(spec: str, *, words: tuple[str, ...] = (), dtype: str = "float32", remat: bool = False,
               mesh: Mesh | None = None) -> tuple[nnx.GraphDef, Any, Any]:
    """(graphdef, params, tokenizer) of a model spec.

    remat: recompute each layer in the backward pass (a property of the graphdef: less activation
    memory for a model that trains, no effect on generation). mesh: place the parameters on their
    shardings from `PARTITION_RULES` over it (default: the default device).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    if "+" in spec:
        base, folder = spec.split("+", 1)
        graphdef, params, tokenizer = load_model(base, words=words, dtype=dtype, remat=remat, mesh=mesh)
        graphdef, params = lora.load(folder, graphdef, params)
        if mesh is not None:
            shardings = sharding.named_shardings(params.adapter, PARTITION_RULES, mesh)
            params = params._replace(adapter=sharding.place(params.adapter, shardings))
        return graphdef, params, tokenizer
    if spec.startswith("tiny:"):
        tokenizer = word_tokenizer(words)
        graphdef, params = init(tiny_config(len(tokenizer)), seed=int(spec.split(":", 1)[1]),
                                param_dtype=DTYPES[dtype], remat=remat)
        if mesh is not None:
            params = sharding.place(params, sharding.named_shardings(params, PARTITION_RULES, mesh))
    else:
        _, (graphdef, params), tokenizer = from_pretrained(spec, dtype=DTYPES[dtype], mesh=mesh, remat=remat)
        if tokenizer is None:
            raise ValueError(f"{spec} has no tokenizer ({' / '.join(TOKENIZER_FILES)}); a player needs one")
    return graphdef, params, without_thinking(tokenizer)

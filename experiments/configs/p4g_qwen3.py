"""P4G RL with Qwen3 models (0.6B, 1.7B, 4B, or any HF folder) as persuader and persuadee: GPU / TPU jobs.

The argument is SIZE[:MODE] or FOLDER[:MODE]; the model folder defaults to /models/Qwen3-SIZE (override
agent.model and the simulator key the mode reads, sim.model or sim.models, or pass the folder as the
argument). The held-out user is p4g_rl's, the P4G human proxy (SmolLM2 + its LoRA adapter), unless
eval.sim_models says otherwise:

    python -m experiments.run --config=experiments/configs/p4g_qwen3.py:1.7b
    python -m experiments.run --config=experiments/configs/p4g_qwen3.py:4b:verbalized --config.mesh.fsdp=8
    python -m experiments.run --config=experiments/configs/p4g_qwen3.py:/data/Qwen3-0.6B:cotrain

Full P4G dialogues (10 turns per role, replies up to 96 tokens, sequences up to 4096 tokens), bfloat16
parameters and AdamW moments, 16 personas x 8 rollouts per step. `python -m experiments.configs.p4g_qwen3`
prints the expected memory per device (docs/p4g.md has the table); a test runs one training step of each
size on a tiny random checkpoint of the same architecture.
"""

from __future__ import annotations

import dataclasses

from experiments.configs import p4g_rl
from scope_jax.models.attention import scores_bytes
from scope_jax.models.config import ModelConfig

_QWEN3 = dict(model_type="qwen3", vocab_size=151936, head_dim=128, num_kv_heads=8, rms_norm_eps=1e-6,
              rope_theta=1e6, qk_norm=True, tie_word_embeddings=True, max_position_embeddings=40960)
# The architectures of the released checkpoints (their config.json).
ARCHITECTURES = {
    "0.6b": ModelConfig(hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16, **_QWEN3),
    "1.7b": ModelConfig(hidden_size=2048, intermediate_size=6144, num_layers=28, num_heads=16, **_QWEN3),
    "4b": ModelConfig(hidden_size=2560, intermediate_size=9728, num_layers=36, num_heads=32, **_QWEN3),
}
FOLDERS = {"0.6b": "/models/Qwen3-0.6B", "1.7b": "/models/Qwen3-1.7B", "4b": "/models/Qwen3-4B"}
SEQUENCE = 4096  # agent.max_context: the longest prompt or dialogue view
TYPICAL = 2048  # a 10-turn dialogue view: system prompt + 20 replies of up to 96 tokens + template
BYTES = {"bfloat16": 2, "float32": 4}


def get_config(arg: str = "0.6b"):
    size, _, mode = arg.partition(":")
    config = p4g_rl.get_config(mode or "frozen", model=FOLDERS.get(size, size))
    config.env.max_turns = 10
    # remat: without it the activations of one 2048-token sequence take 16 to 43 GiB (docs/p4g.md)
    config.agent.update(dtype="bfloat16", max_context=SEQUENCE, remat=True)
    config.sim.remat = True
    config.sampling.max_new_tokens = 96
    config.verbalized.update(k=5, max_retries=2, max_new_tokens=384)
    config.rollout.update(groups=16, group_size=8)
    config.optimizer.update(learning_rate=1e-6, sim_learning_rate=1e-6, warmup_steps=10)
    # 128 dialogues in 16 micro-batches: one sequence per device and micro-batch on 8 devices
    config.train.update(steps=200, eval_every=20, eval_groups=16, checkpoint_every=20, samples=8,
                        microbatches=16)
    config.monitor.update(probe_contexts=16, probe_samples=8, fork_contexts=4, forks=4, branches=4)
    return config


@dataclasses.dataclass(frozen=True)
class Memory:
    """Expected bytes per device of a training step: the joint state (params, gradients, AdamW moments,
    KL references, frozen simulators; all FSDP-sharded) plus the activations of the micro-batch's
    sequences on the device, with and without rematerialising each layer in the backward pass."""

    state: float
    activations: float
    activations_remat: float

    @property
    def total(self) -> float:
        return self.state + self.activations

    @property
    def total_remat(self) -> float:
        return self.state + self.activations_remat


def memory_per_device(arch: ModelConfig, *, dtype: str = "bfloat16", trained: int = 1, frozen: int = 2,
                      references: int = 0, shards: int = 1, sequences: int = 1, length: int = TYPICAL,
                      logit_chunk: int = 128) -> Memory:
    """Memory of one train step per device.

    trained / frozen / references: how many models of `arch` train (agent, co-trained simulators), sit
    frozen (the simulator in frozen / verbalized mode, and the held-out simulator, which the loop places
    on the mesh too), or serve as KL references; each trained model holds params, a gradient and two
    AdamW moments in `dtype`. shards: devices the parameters are sharded over (fsdp x tensor).
    sequences: sequences of `length` tokens per device in one micro-batch. Activations per layer: the
    saved matmul inputs and outputs (in `dtype`) plus the float32 attention scores and probabilities the
    decoder holds at once (`scope_jax.models.attention.scores_bytes`: blockwise, one tile per kv head, at
    these lengths); the output head is chunked (`logit_chunk` tokens of float32 logits, kept three times).
    Rough by design (XLA's buffer reuse is not modelled): meant to choose a layout, not to promise a number.
    """
    b = BYTES[dtype]
    n = arch.num_params
    state = n * b * (4 * trained + frozen + references) / shards
    d, f = arch.hidden_size, arch.intermediate_size
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    per_token = b * (4 * d + 2 * q + 2 * kv + 3 * f)  # norms' inputs, q/k/v/attention output, MLP
    attention = 2 * scores_bytes(length, length, arch.num_kv_heads, arch.num_heads // arch.num_kv_heads)
    layer = sequences * (length * per_token + attention)
    head = sequences * 3 * 4 * logit_chunk * arch.vocab_size
    saved_inputs = sequences * length * d * b * arch.num_layers
    return Memory(state=state, activations=arch.num_layers * layer + head,
                  activations_remat=saved_inputs + layer + head)


def kv_cache_bytes(arch: ModelConfig, rows: int, length: int = SEQUENCE, dtype: str = "bfloat16") -> float:
    """The KV cache of one generate call: `rows` prompts padded to `length` slots."""
    return 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * length * rows * BYTES[dtype]


def memory_table(shards: int = 8, rows: int = 128, length: int = TYPICAL, sequence: int = SEQUENCE) -> str:
    """The docs' table (GiB): per device for frozen-simulator training and for co-training on `shards`
    devices (one sequence of `length` tokens per device), and the KV cache of a generate call over a
    whole rollout batch of `rows` dialogues at `sequence` slots (in total, and per device with the rows
    spread over `shards` data-parallel devices)."""
    gib = 2.0**30
    lines = [f"| model | params | mode | state / device | + activations, 1 sequence of {length} tokens "
             f"| the same with remat | KV cache, {rows} x {sequence} tokens: total | / device |",
             "|---|---|---|---|---|---|---|---|"]
    for size, arch in ARCHITECTURES.items():
        for mode, roles in (("frozen", dict(trained=1, frozen=2)),
                            ("cotrain", dict(trained=2, frozen=1, references=1))):
            m = memory_per_device(arch, shards=shards, length=length, **roles)
            cache = kv_cache_bytes(arch, rows, sequence) / gib
            lines.append(f"| Qwen3-{size.upper()} | {arch.num_params / 1e9:.2f}B | {mode} "
                         f"| {m.state / gib:.1f} | {m.total / gib:.1f} | {m.total_remat / gib:.1f} "
                         f"| {cache:.0f} | {cache / shards:.1f} |")
    return "\n".join(lines)


def kv_memory_table(lengths: tuple[int, ...] = (4096, 8192), rows: int = 16, prefix: int = 4096,
                    own: int = 1024, dtype: str = "bfloat16") -> str:
    """The KV-cache docs' table (docs/kv_cache.md): per model, the cache of one token and of one row of each
    length; `rows` rows that each hold a `prefix`-token prompt and `own` tokens of their own, with the
    prompt copied per row and shared once; and the float32 attention scores plus probabilities one layer
    of a prefill of `rows` rows x length tokens holds at once, dense and blockwise."""
    mib, gib = 2.0**20, 2.0**30
    header = ["model", "KV / token"] + [f"KV / row, {n // 1024}k" for n in lengths] + [
        f"{rows} rows x ({prefix} + {own}): prompt per row", "prompt shared"] + [
        f"prefill {rows} x {n // 1024}k, one layer: dense scores" for n in lengths] + ["blockwise"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for size, arch in ARCHITECTURES.items():
        per_token = kv_cache_bytes(arch, 1, 1, dtype)
        groups = arch.num_heads // arch.num_kv_heads
        dense = [2 * rows * 4 * arch.num_heads * n * n / gib for n in lengths]
        blockwise = 2 * rows * scores_bytes(lengths[-1], lengths[-1], arch.num_kv_heads, groups) / mib
        cells = [f"Qwen3-{size.upper()}", f"{per_token / 1024:.0f} KiB"]
        cells += [f"{per_token * n / mib:.0f} MiB" for n in lengths]
        cells += [f"{per_token * rows * (prefix + own) / gib:.1f} GiB",
                  f"{per_token * (prefix + rows * own) / gib:.1f} GiB"]
        cells += [f"{d:.0f} GiB" for d in dense] + [f"{blockwise:.0f} MiB"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(memory_table())
    print()
    print(kv_memory_table())

"""tau2-bench retail RL with Qwen3 (0.6B, 1.7B, 4B, or any HF folder) as agent, user simulator and judge:
GPU / TPU jobs.

The argument is SIZE[:MODE] or FOLDER[:MODE]; the model folder defaults to /models/Qwen3-SIZE (override
agent.model, eval.sim_models, env.judge_model and the simulator key the mode reads, or pass the folder):

    python -m experiments.run --config=experiments/configs/tau2_qwen3.py:1.7b --config.mesh.fsdp=8
    python -m experiments.run --config=experiments/configs/tau2_qwen3.py:4b:cotrain --config.mesh.fsdp=8

The full benchmark: the agent's prompt holds the policy, Qwen3's template renders the tool schemas
(`tools=`) and the tool results (`<tool_response>` in a user turn): 4.8k tokens (SmolLM2's tokenizer)
before the first message; episodes of up to 30 tau2 steps, replies up to 256 tokens, views up to 8,192
tokens; 8 tasks x 8 rollouts per step in 16 micro-batches, bfloat16, remat. `python -m
experiments.configs.tau2_qwen3` prints the expected memory per device (docs/tau2.md has the table).
"""

from __future__ import annotations

from experiments.configs import tau2
from experiments.configs.p4g_qwen3 import ARCHITECTURES, FOLDERS, kv_cache_bytes, memory_per_device

SEQUENCE = 8192  # agent.max_context: policy and tools, then 30 steps of dialogue and tool results
TYPICAL = 6144  # a view of ~15 agent steps: 4.5k of prompt, replies, user turns and tool results
ROWS = 64  # dialogues per step: one generate call holds all of them


def get_config(arg: str = "0.6b"):
    size, _, mode = arg.partition(":")
    config = tau2.get_config(mode or "frozen", model=FOLDERS.get(size, size))
    config.env.update(max_steps=30, tool_format="template", agent_prompt="full")
    config.agent.update(dtype="bfloat16", max_context=SEQUENCE, remat=True)
    config.sim.remat = True
    config.sampling.max_new_tokens = 256
    config.verbalized.update(k=5, max_retries=2, max_new_tokens=512)
    config.rollout.update(groups=8, group_size=8)
    config.optimizer.update(learning_rate=1e-6, sim_learning_rate=1e-6, warmup_steps=10)
    config.train.update(steps=200, eval_every=20, eval_groups=8, checkpoint_every=20, samples=8,
                        microbatches=16)
    config.monitor.update(probe_contexts=8, probe_samples=8, fork_contexts=2, forks=4, branches=4)
    return config


GIB = 2.0**30
# frozen: the agent trains; user simulator, held-out user and judge (the same model) are frozen.
# cotrain: agent and user train (with the user's KL reference); held-out user and judge are frozen.
MODES = (("frozen", dict(trained=1, frozen=3)), ("cotrain", dict(trained=2, frozen=2, references=1)))
COLUMNS = (  # (label, key, format)
    ("model", "model", "{}"), ("mode", "mode", "{}"), ("state / device", "state", "{:.1f}"),
    (f"+ activations, 1 x {TYPICAL} tokens, remat", "remat", "{:.1f}"), ("without remat", "plain", "{:.0f}"),
    (f"KV cache, {ROWS} x {SEQUENCE} / device", "cache", "{:.1f}"),
    (f"prefill scores, one layer, {ROWS} x {SEQUENCE} / device", "prefill", "{:.0f}"),
)


def memory_rows(shards: int = 8) -> list[dict]:
    """Memory per device (GiB) of each size and mode, the state FSDP-sharded and the generate call's rows
    spread over `shards` devices; the prefill's float32 attention scores (heads x L^2 per row) of one layer
    come on top of the KV cache."""
    rows = []
    for size, arch in ARCHITECTURES.items():
        for mode, roles in MODES:
            m = memory_per_device(arch, shards=shards, length=TYPICAL, **roles)
            prefill = ROWS / shards * arch.num_heads * SEQUENCE**2 * 4
            cache = kv_cache_bytes(arch, ROWS, SEQUENCE) / shards
            rows.append(dict(model=f"Qwen3-{size.upper()}", mode=mode, state=m.state / GIB,
                             remat=m.total_remat / GIB, plain=m.total / GIB, cache=cache / GIB,
                             prefill=prefill / GIB))
    return rows


def memory_table(shards: int = 8) -> str:
    lines = ["| " + " | ".join(label for label, _, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join(lines + ["| " + " | ".join(fmt.format(row[key]) for _, key, fmt in COLUMNS) + " |"
                              for row in memory_rows(shards)])


if __name__ == "__main__":
    print(memory_table())

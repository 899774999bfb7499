"""CooperBench RL with Qwen3 models (0.6B, 1.7B, 4B, or any HF folder) in both seats: GPU / TPU jobs.

The argument is SIZE[:MODE] or FOLDER[:MODE], MODE as in cooperbench.py (frozen, cotrain, population,
rotation, selfplay, solo); the model folder defaults to /models/Qwen3-SIZE:

    python -m experiments.run --config=experiments/configs/cooperbench_qwen3.py:1.7b
    python -m experiments.run --config=experiments/configs/cooperbench_qwen3.py:4b:cotrain \
        --config.mesh.fsdp=8

8 tool calls per seat, replies up to 384 tokens (enough for a small write_file), tool results up to 2,000
characters and messages up to 400, so a seat's view holds up to `context_budget` tokens (the
agent.max_context it sets); bfloat16 parameters and AdamW moments, remat, 8 task pairs x 4 rollouts per
step in 4 micro-batches (one sequence per device and micro-batch on 8 devices), each training pair's seat
order drawn at random (a GRPO group shares one), the suite's two held-out tasks for evaluation.
`python -m experiments.configs.cooperbench_qwen3` prints the expected memory per device
(docs/cooperbench.md has the table).
"""

from __future__ import annotations

from experiments.configs import cooperbench, p4g_qwen3

ROWS = 32  # dialogues per step: 8 pairs x 4 rollouts


def get_config(arg: str = "0.6b"):
    size, _, mode = arg.partition(":")
    config = cooperbench.get_config(mode or "frozen", model=p4g_qwen3.FOLDERS.get(size, size))
    config.env.update(max_turns=8, max_observation_chars=2000, max_message_chars=400, max_messages=4,
                      test_wall_seconds=30.0, swap_seats=True)
    config.sampling.max_new_tokens = 384
    budget = cooperbench.context_budget(config.env.mode, config.env.max_turns, config.sampling.max_new_tokens,
                                        config.env.max_observation_chars, config.env.max_message_chars)
    config.agent.update(dtype="bfloat16", max_context=budget, remat=True)
    config.sim.remat = True
    groups = 8
    config.rollout.update(groups=groups, group_size=ROWS // groups)
    config.optimizer.update(learning_rate=1e-6, sim_learning_rate=1e-6, warmup_steps=10)
    config.train.update(steps=200, eval_every=20, eval_groups=4, checkpoint_every=20, samples=4,
                        microbatches=4)
    config.monitor.update(probe_contexts=4, probe_samples=4, fork_contexts=2, forks=2, branches=2)
    return config


if __name__ == "__main__":
    budget = get_config().agent.max_context
    print(p4g_qwen3.memory_table(shards=8, rows=ROWS, length=budget, sequence=budget))

"""CooperBench RL with a real LLM on this CPU: SmolLM2-135M-Instruct as both coding agents, on our suite.

A tiny real run: a few GRPO steps, 2 task pairs x 2 rollouts per step, 2 tool calls per seat, replies
of at most 48 tokens, short tool results. The agent is seat 1; the partner (seat 2) is the simulator side,
and the argument picks its simulator mode (scope_jax.simulators.modes):

    python -m experiments.run --config=experiments/configs/cooperbench.py[:MODE]

MODE: frozen (the default: a frozen partner), cotrain (the partner trains too), population (2 co-trained
partners), rotation (2 frozen partners in turn), selfplay (one model in both seats), solo (one agent
implements both features).

Both seats share the reward (both features pass on the merge), so a trained partner is cooperative
(`sim.objective = "cooperative"`). Two tasks are held out for the "eval" split, where the agent plays a
fresh SmolLM2 partner. `solo` is CooperBench's solo baseline: the environment's solo mode (the agent gets
both specs) with a frozen partner that never speaks.
"""

from experiments.jobs.cooperbench import default_config
from scope_jax.simulators.modes import sim_settings

SMOLLM2 = "smollm2-135m-instruct"
MODES = ("frozen", "cotrain", "population", "rotation", "selfplay", "solo")
EVAL_TASKS = ("markup", "stats")  # held out: a same-function task and a shared-helper task

# The context budget: the longest system prompt and opening (SmolLM2's tokens; the solo prompt holds
# both specs), then per turn the reply, the tool result and a partner's message (at most
# CHARS_PER_TOKEN characters a token: code and JSON tokenise at about 3), and the template's tokens.
PROMPT_TOKENS = {"coop": 730, "solo": 945}
CHARS_PER_TOKEN = 2.5
TEMPLATE_TOKENS = 32


def context_budget(env_mode: str, turns: int, reply_tokens: int, observation_chars: int,
                   message_chars: int) -> int:
    """Tokens a seat's whole view may take, rounded up to a multiple of 128."""
    per_turn = reply_tokens + (observation_chars + message_chars) / CHARS_PER_TOKEN + TEMPLATE_TOKENS
    tokens = PROMPT_TOKENS[env_mode] + turns * per_turn
    return int(-(-tokens // 128) * 128)


def get_config(mode: str = "frozen", model: str = SMOLLM2):
    """The CooperBench RL config for partner mode `mode` (one of MODES), `model` in every seat."""
    if mode not in MODES:
        raise ValueError(f"unknown cooperbench mode {mode!r}; one of {', '.join(MODES)}")
    env_mode, sim_mode = ("solo", "frozen") if mode == "solo" else ("coop", mode)
    config = default_config()
    config.env.update(mode=env_mode, max_turns=2, max_observation_chars=600,
                      max_message_chars=200, max_messages=2, eval_tasks=EVAL_TASKS, test_wall_seconds=20.0)
    config.sampling.update(temperature=1.0, top_p=1.0, max_new_tokens=48)
    budget = context_budget(env_mode, config.env.max_turns, config.sampling.max_new_tokens,
                            config.env.max_observation_chars, config.env.max_message_chars)
    config.agent.update(model=model, max_context=budget, remat=True)
    config.sim.update(sim_settings(sim_mode, model=model, models=(model, model), population=2),
                      objective="cooperative", remat=True)
    config.eval.sim_models = (model,)
    # population: every member needs 2 rollouts of each pair for its group advantages
    config.rollout.update(groups=2, group_size=4 if sim_mode == "population" else 2)
    config.optimizer.update(learning_rate=1e-5, sim_learning_rate=1e-5)
    config.train.update(steps=2, eval_every=2, eval_groups=1, checkpoint_every=2, samples=2,
                        microbatches=2)
    config.monitor.update(probe_contexts=1, probe_samples=2, fork_contexts=1, forks=2, branches=2)
    return config

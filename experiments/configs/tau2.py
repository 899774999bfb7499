"""tau2-bench retail RL on this CPU: SmolLM2-135M-Instruct as the agent and as the user simulator.

A tiny real run: 2 GRPO steps on the train split, 1 task x 2 rollouts per step, episodes of at most 6
tau2 steps, replies of at most 48 tokens, held-out evaluation on the test split at the last step. The
argument picks the simulator mode (the modes of scope_jax.simulators.modes, applied to the user):

    python -m experiments.run --config=experiments/configs/tau2.py             # frozen user simulator
    python -m experiments.run --config=experiments/configs/tau2.py:verbalized  # Verbalized Sampling
    python -m experiments.run --config=experiments/configs/tau2.py:cotrain     # the user trains too
    python -m experiments.run --config=experiments/configs/tau2.py:population  # 2 co-trained users
    python -m experiments.run --config=experiments/configs/tau2.py:rotation    # 2 frozen users in turn
    python -m experiments.run --config=experiments/configs/tau2.py:mixture     # the same, within each step
    python -m experiments.run --config=experiments/configs/tau2.py:selfplay    # one model plays both roles

SmolLM2's chat template ignores `tools=`, so the tools use the "text" format (the `<tool_call>` JSON
convention in the system prompt, results as `<tool_response>` user turns). The full agent prompt (policy
and tool schemas, about 4.8k SmolLM2 tokens) is out of reach of this CPU, so the agent gets the compact
prompt (about 850 tokens: no policy, one line per tool); the user gets the sheet's guideline prompt and
its scenario. NL assertions are judged by SmolLM2 too (`env.judge_model`). A trained user is the agent's
adversary (`sim.objective = "adversarial"`). experiments/configs/tau2_qwen3.py is the full-size job.
"""

from scope_jax.simulators.modes import sim_settings
from scope_jax.training.config import default_config, env_settings

SMOLLM2 = "smollm2-135m-instruct"


def get_config(mode: str = "frozen", model: str = SMOLLM2):
    """The tau2 RL config for simulator mode `mode`, with `model` (a spec: name, HF folder, .gguf) as agent,
    user simulator, held-out user, and judge; the Qwen3 config starts from this."""
    config = default_config()
    config.env = env_settings("tau2")
    config.env.update(data_dir="../shared/data/tau2", domain="retail", max_steps=6,
                      max_errors=10, grading="basis", tool_format="text", agent_prompt="compact",
                      judge_model=model)
    # remat: without it the train step over 2k-token views took 11.8 GB here and was OOM-killed
    config.agent.update(model=model, max_context=2048, remat=True)
    config.sim.remat = True
    config.sim.update(sim_settings(mode, model=model, models=(model, model), population=2),
                      objective="adversarial")
    config.algo.sim_kl_coef = 0.05
    config.eval.sim_models = (model,)
    config.sampling.update(temperature=0.7, top_p=1.0, max_new_tokens=48)
    config.verbalized.update(k=3, max_retries=0, max_new_tokens=96)
    # a population needs 2 rollouts per member and task for the members' group advantages
    config.rollout.update(groups=1, group_size=4 if mode == "population" else 2)
    config.optimizer.update(learning_rate=1e-5, sim_learning_rate=1e-5)
    config.train.update(steps=2, eval_every=2, eval_groups=1, checkpoint_every=2, samples=1, microbatches=2)
    config.monitor.update(probe_contexts=1, probe_samples=2, fork_contexts=1, forks=2, branches=2)
    return config

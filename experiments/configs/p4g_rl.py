"""P4G RL with a real LLM on this CPU: SmolLM2-135M-Instruct as persuader (agent) and persuadee (simulator).

A short real run: a handful of GRPO steps, 2 personas x 4 rollouts per step, one turn per role plus the
closing question, replies of at most 32 tokens. Curves, metrics and a few dialogues per eval
(samples/step-S.jsonl) land in the run directory. The argument picks what the agent trains against:

    python -m experiments.run --config=experiments/configs/p4g_rl.py               # frozen prompted simulator
    python -m experiments.run --config=experiments/configs/p4g_rl.py:verbalized    # Verbalized Sampling
    python -m experiments.run --config=experiments/configs/p4g_rl.py:cotrain       # the persuadee trains too
    python -m experiments.run --config=experiments/configs/p4g_rl.py:cotrain_data  # ... with a data anchor
    python -m experiments.run --config=experiments/configs/p4g_rl.py:fitted        # a frozen fitted simulator
    python -m experiments.run --config=experiments/configs/p4g_rl.py:population    # 2 co-trained ones
    python -m experiments.run --config=experiments/configs/p4g_rl.py:rotation      # 2 frozen, in turn
    python -m experiments.run --config=experiments/configs/p4g_rl.py:mixture       # 2 frozen, each step
    python -m experiments.run --config=experiments/configs/p4g_rl.py:selfplay      # one model, both roles

Held-out evaluation plays the held-out personas (env split "eval") against the judge, the P4G human proxy
(`PROXY`: SmolLM2 with the LoRA adapter fine-tuned on the judge split's human persuadees, docs/sft.md),
whatever the agent trained against, before the first update (the untrained agent's baseline) and before
the last; its dialogues are written to samples/eval-step-S.jsonl. The agent trains on the personas of
the simulator split (`env.train_split`), which no judge was fitted on. `fitted` trains against `FITTED`:
SmolLM2 with a LoRA adapter fitted like the proxy but on the simulator split
(`experiments/configs/sft.py:fitted`, copied to docs/results/p4g_fitted/adapter), never the judge; a
config that trains against a model fitted on judge data, or anchors on it, is refused. A trained persuadee
is the agent's adversary (`sim.objective =
"adversarial"`: its reward is minus the persuader's, so it learns to resist, kept near the
persona-following model by the KL anchor); the "cooperative" objective would reward it for donating,
which pushes it toward the agreeable persuadee that co-training is meant to break. `cotrain_data` adds
the data anchor: the persuadee's loss also has `sim.data_coef` x its NLL of the simulator split's human
persuadee turns (`training.data_anchor`), at weight 1 (not tuned). A dialogue whose donation cannot be
read gets `env.unreadable_reward` (counted as env/unreadable). Only one real model is available offline,
so `rotation` and `mixture` take turns between two copies of SmolLM2 and `population` starts both members
from it (they drift apart only as they train).
"""

import pathlib

from scope_jax.simulators.modes import sim_settings
from scope_jax.training.config import default_config, env_settings

SMOLLM2 = "smollm2-135m-instruct"
ROOT = pathlib.Path(__file__).resolve().parents[2]
PROXY = f"{SMOLLM2}+{ROOT / 'docs' / 'results' / 'p4g_proxy' / 'adapter'}"  # the judge: base+adapter
FITTED = f"{SMOLLM2}+{ROOT / 'docs' / 'results' / 'p4g_fitted' / 'adapter'}"  # fitted on the simulator split
# Arguments that are a simulator mode with sim settings of their own: (mode, those settings)
VARIANTS = {"fitted": ("frozen", {"model": FITTED}),
            "cotrain_data": ("cotrain", {"data_coef": 1.0, "data": "p4g_human:simulator"})}


def get_config(mode: str = "frozen", model: str = SMOLLM2):
    """The P4G RL config for simulator mode (or `VARIANTS` entry) `mode`, with `model` (a spec: name, HF
    folder, .gguf) in both roles and for rotation, the proxy as the held-out simulator; the larger-model
    configs start from this."""
    mode, variant = VARIANTS.get(mode, (mode, {}))
    config = default_config()
    config.env = env_settings("p4g")
    config.env.update(max_turns=1, unreadable_reward=0.0, train_split="simulator")
    config.agent.update(model=model, max_context=1024)
    config.sim.update(sim_settings(mode, model=model, models=(model, model), population=2),
                      objective="adversarial")
    config.sim.update(variant)
    config.algo.sim_kl_coef = 0.05  # keep a trained persuadee near the persona-following model
    config.eval.sim_models = (PROXY,)
    # top_p stays 1: the train step recomputes log-probs at the sampling temperature but cannot truncate
    config.sampling.update(temperature=0.7, top_p=1.0, max_new_tokens=32)
    config.verbalized.update(k=4, max_retries=0, max_new_tokens=128)
    config.rollout.update(groups=2, group_size=4)
    config.optimizer.update(learning_rate=1e-5, sim_learning_rate=1e-5)
    config.train.update(steps=4, eval_every=4, eval_first=True, eval_groups=2, checkpoint_every=2, samples=2)
    config.monitor.update(probe_contexts=2, probe_samples=2, fork_contexts=1, forks=2, branches=2)
    return config

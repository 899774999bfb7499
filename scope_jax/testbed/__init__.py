"""The simulator-collapse testbed: the persona game (`scope_jax.envs.personas`) played by tiny
transformers (`scope_jax.envs.persona_lm`), end to end on a CPU.

  pretrain.py    supervised pretraining: agent (P4G behaviour), base / held-out simulators, the
                 alignment-like collapse step (with Verbalized Sampling instruction following)
  rl.py          one arm's RL run: rollout + the project's train step, scanned over steps, vmapped over seeds
  arms.py        the arms (untrained, frozen, verbalized, cotrain, population, rotation, ...) as data
  evaluate.py    exact metrics of a tabulated agent (value, success, deviation, variance split, entropies)
  tabulation.py  transformer players read out at every decision state; pretraining diagnostics
  arm_store.py   finished arms in the run directory and their records in metrics.jsonl (resuming)
  experiment.py  pretrain -> tabulate -> every arm on the same seeds -> exact evaluation of snapshots
  statistics.py  summary.json: final numbers per seed, 95% t-intervals, paired deltas over the controls
  figures.py     the curves per arm with their 95% bands
  prose.py       summary.md's sentences and tables and the README block, from the summary alone
  report.py      summary.md's page with its optional sections; writes figures, summary.json, summary.md
  user_data.py, fitting.py, data_report.py, scarce_report.py   user data, simulators fitted to them, and
                 the data curve's and the scarce-data study's sections of the report
  tabular.py     the tabular game co-trained with exact gradients (the tabular studies)

Run it with `python -m experiments.run --config=experiments/configs/collapse.py[:ARG]`, ARG one of
quick, all, sweep, data, scarce (experiments/configs/collapse.py).
"""

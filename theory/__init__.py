"""Exact toy models for the paper's statements, in our own formalization (see theory/README.md).

toy               the tabular softmax agent and user simulator, exactly enumerated over all trajectories
gradient_bias     Theorem 3.2: gradient bias against the mode user
variance_split    Lemma 3.3: simulator-side and agent-side reward variance, zero-variance GRPO groups
concentration     Proposition 3.4: mirror descent and policy gradient concentrate on the shortcut set
entropy_collapse  Corollary 3.5: geometric concentration and the entropy bound
regret            Proposition 3.6: deployment regret, the shortcut-vs-robust toy and its two fixes
checks            measured / bound ratios and their summary, as written to checks.json
plots             one figure per statement
"""

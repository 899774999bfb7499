"""tau2-bench's mock and retail domains, re-implemented from the fact sheet (docs/tau2.md).

Modules, one concept each:
  db            tables of records, copied on write, and the canonical hash
  toolkit       tool dispatch: error results, result serialisation, tool kinds
  arithmetic    the `calculate` tool's arithmetic
  retail, mock  the domains' tools (retail: quirks Q1-Q9 and their fixes)
  tasks, data   tasks and splits; reading the data folder
  trajectory    the turns the evaluator reads
  domain        a loaded domain and the states episodes start from (initial state, gold replay)
  tool_calls    tool calls in generated text (parser, canonical form)
  schemas       OpenAI function schemas of the tools
  prompts       the roles' system prompts
  judge         the NL_ASSERTION judge contract
  evaluator     the reward components, their product over the basis, pass^k
  environment   the Environment (`Tau2Env`)
  scripted      scripted speakers (oracle, null agent, scripted user) and a driver for them
"""

from scope_jax.envs.tau2.environment import Tau2Env

__all__ = ["Tau2Env"]

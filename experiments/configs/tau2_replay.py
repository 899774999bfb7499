"""tau2 gold replay, no model: python -m experiments.run --config=experiments/configs/tau2_replay.py[:ARG].

Every task's gold actions go through the tau2 environment (oracle agent, scripted user); each task's
end-state hash and reward land in summary.json, checked against the fact sheet's gold hashes
(tau2_gold_hashes.json beside this file). ARG: "retail" or "mock" for one domain, "fixed" for the
retail quirk fixes (new hashes by design: the sheet check is skipped).
"""

from experiments.jobs.tau2_replay import default_config


def get_config(arg: str = ""):
    config = default_config()
    if arg in ("retail", "mock"):
        config.domains = (arg,)
    elif arg == "fixed":
        config.fix_quirks = True
    elif arg:
        raise ValueError(f"unknown argument {arg!r}; use nothing, 'retail', 'mock' or 'fixed'")
    return config

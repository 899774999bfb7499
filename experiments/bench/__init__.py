"""Performance benchmarks, each side by side with a reference: python -m experiments.bench NAME [flags].

One module per benchmark (its docstring says what it measures; `python -m experiments.bench NAME -h`
prints it and its flags), over a shared timing harness (`harness`), XLA profiler (`profiler`) and
PyTorch references (`references`). Every run starts with a header (command, commit, machine, load
average before the run), prints a table and ends with one line `ratio=<ours/reference>` (its headline).
Timed runs of ours and of the reference alternate and each keeps its best of --repeats warm runs
(compilation is excluded and reported separately): on a machine shared with other processes, load only
ever makes a run slower, and alternating exposes both sides to the same load. In `train_step` and `sft`
each side runs twice in a row per round and the second run is timed, so that each step follows itself, as
in a training loop: a step that follows the other library's runs slower (docs/models.md); the first runs
are printed too.

The sampler, rollout, train_step and sft headlines are SmolLM2's: without the SmolLM2 wheel they print
ratio=nan.
"""

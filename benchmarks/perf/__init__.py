"""Speed, memory and diagnostic scripts: each measures one claim side by side in one run and prints it.

They import `agents` and `envace_gym` (the suites under `benchmarks/` are libraries that the agents use;
these scripts sit on top of everything), and no package module imports them. Run them from the repository
root as ``python -m benchmarks.perf.NAME --help``. The experiment protocols (what learns, and how well) are in
`benchmarks.experiments`. Scripts do not import each other: the rollout benchmarks share
`benchmarks.perf.scripted_rollouts`, a module that is not a script.
"""

"""Experiment protocols: scripts that produce a result about the method (what learns, how well, against which
baseline), as opposed to the speed and memory benchmarks of `benchmarks.perf`.

Each runs from the repository root as ``python -m benchmarks.experiments.NAME`` (``--help`` lists its options);
its docstring says what it measures and how. They import `agents` and `envace_gym` (they sit on top of
everything), and no package module imports them. Scripts do not import each other: what two share is a module
that is not a script (`benchmarks.stats`, `benchmarks.experiments.maskable_ppo`,
`benchmarks.experiments.ablations_table`).
"""

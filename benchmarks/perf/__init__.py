"""Performance and diagnostic scripts: each measures one claim side by side in one run and prints it.

They import `agents` and `envace_gym` (the suites under `benchmarks/` are libraries that the agents use;
these scripts sit on top of everything). Run them as ``.venv/bin/python benchmarks/perf/NAME.py --help``.
"""

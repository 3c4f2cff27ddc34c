"""The ``envace`` command line: `main` (the console script) and `build_parser` (`agents.cli.main`), one module
per command (`agents.cli.smoke`, `agents.cli.train`, `agents.cli.sft`, `agents.cli.eval`, `agents.cli.pipeline`,
`agents.cli.serve`, `agents.cli.serve_tools`).
``python -m agents.cli`` runs it as the console script does."""

from agents.cli.main import build_parser, main

__all__ = ["main", "build_parser"]

"""The `tierlog` command, one module per command group; `main` is the console script's entry point."""

from tierlog.cli.main import main

__all__ = ["main"]

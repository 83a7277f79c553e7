"""The ``moeslo`` command line (typer + rich)."""

"""The package version (its own module: ``--version`` imports nothing else)."""

__version__ = "0.1.0"

"""memsave's version: the one place it is written (pyproject.toml reads it, the build stamps it into the extension)."""

__version__ = "0.3.0"

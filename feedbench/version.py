"""The one version string (the package and pyproject read it from here)."""

__version__ = "0.1.0"

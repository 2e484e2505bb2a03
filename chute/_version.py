"""The version of chute (one place; chute/__init__.py re-exports it)."""

__version__ = "0.1.0"

"""Runnable applications shipped with the package (console entry points)."""

"""The package version (one place; the plan and calibration files record it)."""

__version__ = "0.3.0"

"""workbench: generate, watch, report on and tune EAGLE-3 training-data jobs on SGLang."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]

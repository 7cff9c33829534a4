"""The SGLang-compatible simulator: same HTTP API and server flags, a modelled engine.

    from workbench.sim import SimConfig, create_app, serve

`create_app(config)` gives the ASGI app (usable in-process through `httpx.ASGITransport`);
`serve(config)` runs it with uvicorn. The formulas of the model are in `workbench.sim.profiles`.
"""

from __future__ import annotations

from typing import Any

from workbench.sim.config import SimConfig, add_sim_arguments, config_from_args

__all__ = ["SimConfig", "add_sim_arguments", "config_from_args", "create_app", "serve"]


def __getattr__(name: str) -> Any:
    """The app and server on first use: every CLI verb builds the sim's flags (config), and
    importing the app (starlette, the engine, httpx) would cost each a quarter second."""
    if name in ("create_app", "serve"):
        from workbench.sim import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

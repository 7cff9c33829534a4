"""The SGLang-compatible simulator: same HTTP API and server flags, a modelled engine.

    from workbench.sim import SimConfig, create_app, serve

`create_app(config)` gives the ASGI app (usable in-process through `httpx.ASGITransport`);
`serve(config)` runs it with uvicorn. The formulas of the model are in `workbench.sim.profiles`.
"""

from __future__ import annotations

from workbench.sim.app import create_app, serve
from workbench.sim.config import SimConfig, add_sim_arguments, config_from_args

__all__ = ["SimConfig", "add_sim_arguments", "config_from_args", "create_app", "serve"]

"""What the report driver, its kernels and JupyterLab share.

    REPORT_ENV        "1" in the environment of the kernels executing reports: their figures
                      inline plotly.js (:func:`workbench.report.plots.setup_notebook`), so
                      the exported HTML opens offline
    DATA_MIME         the output mimetype under which report blocks carry the data they show
                      (:func:`workbench.report.render.cell_data` reads it back)
    fast_jupyter_imports  nbformat's jsonschema without its seconds-long IRI grammar
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

__all__ = ["DATA_MIME", "REPORT_ENV", "fast_jupyter_imports", "report_kernel_env"]

DATA_MIME = "application/vnd.workbench.data+json"

REPORT_ENV = "WORKBENCH_REPORT"  # "1" in the kernels executing reports: figures inline plotly.js


def fast_jupyter_imports() -> None:
    """Load jsonschema without the rfc3987_syntax package, once per process.

    nbformat (under papermill, nbconvert and plotly's renderers) imports jsonschema, which
    builds rfc3987_syntax's IRI grammar at import when that package is installed: seconds of
    every report's start, in the driver and again in the kernel, for "iri" format checks
    that nothing here asks for (notebook validation checks no formats). Hidden while
    jsonschema loads; importing rfc3987_syntax afterwards works as usual.
    """
    if "jsonschema" in sys.modules or sys.modules.get("rfc3987_syntax") is not None:
        return
    sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]  # an ImportError on import
    try:
        with contextlib.suppress(ImportError):
            import jsonschema  # noqa: F401
    finally:
        if sys.modules.get("rfc3987_syntax", 0) is None:
            del sys.modules["rfc3987_syntax"]


@contextlib.contextmanager
def report_kernel_env() -> Iterator[None]:
    """REPORT_ENV set for the kernels started meanwhile (they inherit the environment)."""
    previous = os.environ.get(REPORT_ENV)
    os.environ[REPORT_ENV] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(REPORT_ENV, None)
        else:
            os.environ[REPORT_ENV] = previous

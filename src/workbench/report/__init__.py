"""``workbench report`` and ``workbench explore``: notebooks turned into reports, and the Lab.

    parameters  which notebook, which parameters, checked before a kernel starts
    render      papermill + nbconvert: the executed notebook and its offline HTML
    jupyter     what the driver, its kernels and JupyterLab share
    provenance  what a report was made from (params.yaml, report.json), --rerun
    plots       plotly figures and HTML views, built from shaped data
    lab         JupyterLab on a run's own explorer notebook
    explorer    the explorer: a run's records, filtered, with live figures
    widgets     the explorer's ipywidgets (JupyterLab only)
"""

"""Reporting: everything shown or drawn is computed from a results file, never measured here.

One module per output: console tables (``*_console``), PNG figures (``*_plots``), the comparison
of several scans (``compare``); a results file as one document (``doc_*``: the answer, summary
table, system under test, method, command), laid out as a self-contained HTML page (``html``
with ``templates/``), Markdown (``markdown``) or CSV (``csv_export``). A new output goes here.
"""

"""Reporting: everything shown or drawn is computed from a results file, never measured here.

One module per output: console tables (``*_console``), PNG figures (``*_plots``), the comparison
of several scans (``compare``), a self-contained HTML page (``html``). A new output goes here.
"""

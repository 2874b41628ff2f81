"""The logic of scripts/bench_scan.py: feedbench scan against fio and plain-Python references.

Imported by the scripts in scripts/ (Python puts a script's folder first on ``sys.path``); not
part of the feedbench package.
"""

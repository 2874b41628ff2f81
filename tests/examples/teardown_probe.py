"""Run a training script as torchrun runs it (``python teardown_probe.py SCRIPT ARGS...``), and
print the threads this rank still has right after each ``destroy_process_group``: a gloo thread
still running there ends at interpreter exit instead, out of step with the other ranks."""

import os
import runpy
import sys
from pathlib import Path

import torch.distributed as dist

_destroy = dist.destroy_process_group


def destroy_and_list_threads(*args, **kwargs):
    _destroy(*args, **kwargs)
    names = sorted(p.read_text().strip() for p in Path("/proc/self/task").glob("*/comm"))
    # one write of the whole line: unbuffered (PYTHONUNBUFFERED), print writes the text and its
    # newline apart, and the two ranks' lines, on one pipe, could run together
    os.write(1, f"threads after destroy_process_group: {' '.join(names)}\n".encode())


dist.destroy_process_group = destroy_and_list_threads
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")

"""Our own CooperBench-style suite: one folder per task, in the real dataset's layout (see ../tasks.py and
docs/cooperbench.md, which lists each task's overlap kind)."""

import pathlib

SUITE_DIR = pathlib.Path(__file__).resolve().parent

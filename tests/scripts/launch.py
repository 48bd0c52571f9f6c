"""Runs a Python script as `__main__` from this module's own body, as
launchers do (`runpy.run_path`; `python -m` and a notebook kernel run the
program's code under their own frames the same way): the program's module
body is then not the outermost one, and no import is running.

Usage: launch.py SCRIPT [ARGS...]
"""
import runpy
import sys

sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")

"""Shared pytest set-up: make ``tests/`` importable (worker functions for spawned ranks live in
``tests/workers`` and are imported by name in the child processes)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("OMP_NUM_THREADS", "1")

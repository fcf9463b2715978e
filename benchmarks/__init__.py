"""Benchmarks, shelved by question (README.md is the index, RESULTS.md the measured tables)."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root

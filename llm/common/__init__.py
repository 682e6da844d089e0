"""What every room below uses and that knows no model: the settings dataclasses, their rules and
the run config read from TOML (all three import no torch), devices, CPU-time profiling sections,
progress bars, the collective that sums over data-parallel ranks, and the Hugging Face
compatibility shims.

Room 1 of 13 in data-flow order: it imports only from no other room and the core ``teamtr``,
never from a room after it (tests/test_package_imports.py).
"""

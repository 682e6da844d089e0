"""Hypothesis strategies and property tests of every lemma and theorem in THEORY.md.

One module of slack functions per THEORY.md section, mirrored by its test file:
``performance_difference``, ``occupancy_shift`` (and Pinsker), ``lemma_3_1``, ``estimators``,
``theorem_3_4``, ``theorem_3_6``, ``theorem_3_7``, ``episodic``, ``stage_loop``, ``stage0``;
``measured_certificate`` checks the measured certificate's bounds against exact improvements
over many sampled runs (tested in ``tests/sim/test_measured_certificate.py``, a statistical
check too long for this directory's budget).
Shared: ``tolerances`` (slack conventions), ``traces`` (exact stage traces), ``instances``
(seeded instance builders), ``strategies`` (their hypothesis versions), ``oracle`` (the
independent dense evaluation). ``checks`` registers every fact for ``teamtr verify``.
"""

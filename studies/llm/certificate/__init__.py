"""The measured certificate on language-model runs (docs/measured_certificate.md):
``measured_table`` tabulates what it certified from run records, ``coupled_pairs`` measures the
pairs' spread with and without common random numbers, and ``cost`` what the held-out pairs cost
a run beside the same run without them, against the floor of any held-out scheme.
"""

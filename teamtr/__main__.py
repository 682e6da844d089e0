"""``python -m teamtr``: the ``teamtr`` console script without installing the package (and the
module ``torchrun -m teamtr`` starts on every rank)."""

from teamtr.cli import main

raise SystemExit(main())

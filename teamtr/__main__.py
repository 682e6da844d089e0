"""``python -m teamtr``: the ``teamtr`` console script."""

from teamtr.cli import main

raise SystemExit(main())

"""The studies: the experiments behind the results and figures of the README and docs/.

This is the top floor. A study may import the core (``teamtr``), the backends (``sim``,
``llm``) and the proofs (``proofs_check``); none of those imports ``studies``
(``tests/test_package_imports.py``). Every study is a ``teamtr`` subcommand, registered in
``pyproject.toml`` by ``studies.commands``; ``tabular`` holds the exact studies on ``sim``
MDPs (no torch), ``llm`` the studies of language-model teams. ``options`` holds the options
every study shares (``--seeds``, ``--radius``, ``--json``, ``--plot``) with their checks, and
``figures`` what their figures share.
"""

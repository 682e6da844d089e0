"""The language-model studies: experiments that train or measure many ``llm`` runs and reduce
them to one result file and one figure (the ``*_plot`` module beside each study).

- ``drift`` (``teamtr llm-scaling``, the package ``studies.llm.drift``): the n^2 versus n drift
  of Thm 3.7 measured on teams of language models, the counterpart of the tabular
  ``teamtr scaling``; figure ``drift.scaling_plot``.
- ``seed_study`` (``teamtr seed-study``, or ``python -m studies.llm.seed_study``): every method
  trained with every seed under one budget, side by side; figure ``seed_study_plot``.
- ``compare_report`` (``teamtr compare-report``, or ``python -m studies.llm.compare_report``):
  the summary of a set of finished runs and their evaluations; figure ``compare_report_plot``.
- ``checkpoint_curves`` (``python -m studies.llm.checkpoint_curves``): every stage checkpoint of
  a set of runs evaluated afterwards: held-out curves against training CPU, regressions, the
  minutes to reach a level (``--reach``); ``run_records`` reads the runs' metrics for it.
- ``step_size_map`` (``python -m studies.llm.step_size_map``): the curves of runs at several
  trust-region radii read at one budget, each scheme's row and its paired difference from stale.
- ``team_size`` (``python -m studies.llm.team_size``): one step-size map per team size read at one
  radius: each scheme's row and its paired gap from stale against n.
- ``weight_collapse`` (``python -m studies.llm.weight_collapse``): HAPPO's effective sample size
  at each update position of a stage, from its runs' stage records.
- ``sum_probe`` (``python -m studies.llm.sum_probe``): each role of a private-notes sum team
  played on its own after teammates that spoke right: which role stops the team.
- ``demo_summary`` (``python -m studies.llm.demo_summary``): the line ``make demo`` ends with,
  the default team's held-out accuracy before and after its training.

torch is imported only inside the functions that train or measure, so reading a study's options
or its results (``--help``, ``--report``, the README's tables) loads no model code.
"""

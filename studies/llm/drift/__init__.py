"""The drift study of language-model teams (``teamtr llm-scaling``): how far one stage of
stale and of TeamTR moves the team's occupancy against the number of agents n, the n^2 against
n of Thm 3.7 measured on real models; ``scaling`` runs it and ``scaling_plot`` draws it.
"""

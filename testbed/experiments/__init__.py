"""Experiments made of runs: one run by either backend, a comparison of policies, a sweep over
a design space, and the inputs with overrides applied; and planning with the simulator
(planning.py), which everything that plans is handed from here."""

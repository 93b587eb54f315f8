"""``durably bench``: what durably costs on this machine and this database, each figure
beside a baseline measured in the same run (a raw commit of the same database).

``workloads`` holds the workloads and the raw baselines (the repository's ``python -m
benchmarks`` times the same ones, with DBOS beside them), ``recovery`` and
``processes`` the rows that run child processes (a SIGKILLed worker's workflows
recovered; several worker processes beside one), ``scratch`` the scratch databases a
run measures in (never the database it is given), ``report`` the rows, the
interleaved rounds and the table. Loaded only by the command: ``import durably``
does not import it.
"""

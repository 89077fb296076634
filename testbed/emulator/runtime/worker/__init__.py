"""The worker process (one per GPU) and the decode server, and the stage's data plane they
run (stage_runner.py, its collectives stage_collectives.py), on three folders that import
downward only: transport/ (bytes between processes, the run's clock), collectives/ (the
ring and what a member puts on it), compute/ (emulated or real torch compute, which hands
collectives/ its contributions)."""

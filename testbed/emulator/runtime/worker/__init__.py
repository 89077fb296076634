"""The worker process (one per GPU) and the decode server: transport, the stage's data plane,
compute (emulated or real torch), collectives."""

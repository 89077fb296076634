"""The coordinator process that owns an emulated run: hosts, the workers' pool, the control
socket, arbitration and bubble bridges, health, memory, timed events, runs across machines."""

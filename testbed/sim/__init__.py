"""The discrete-event simulator: the plan interpreted against a flow-level model of the WAN,
and its backend (backend.py), the emulator's sibling. Planning with it is
testbed.experiments.planning's, above both."""

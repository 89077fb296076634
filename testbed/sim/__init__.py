"""The discrete-event simulator: the plan interpreted against a flow-level model of the WAN,
and the planning context policies simulate candidates in."""

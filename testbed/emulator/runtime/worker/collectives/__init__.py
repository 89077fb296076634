"""A stage's replicas reducing together: the ring over any send and receive, the payloads
a member puts on it (dense, cast, quantized, top-k), the state syncs keep (outer
optimizers, error feedback), a collective started inside a backward. Imports nothing else
of the worker: the transport is handed in, and compute imports this, not the reverse."""

"""What a worker computes: the torch model cut into stages, the real and the emulated
engines, split backwards, prefill, the one-process reference, resharding a checkpoint.
Imports collectives/ (what it contributes to a reduction), never transport/."""

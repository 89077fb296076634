"""What a run is, whichever backend runs it: its spec, the Backend protocol, checkpoints and
saved progress, recovery and segments between failures, resuming, time dilation."""

"""What a run is, whichever backend carries it out: its spec, the Backend protocol, the
simulator's prediction as the emulator is handed it, checkpoints and saved progress,
recovery and segments between failures, resuming, time dilation. Below both backends, it
imports neither."""

"""`testbed launch`: a researcher's own program, unmodified, over the emulated WAN."""

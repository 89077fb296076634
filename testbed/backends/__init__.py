"""The two backends behind one protocol (testbed.run.backend): the simulator and the emulator."""

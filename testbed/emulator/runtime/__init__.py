"""The emulator's processes: the coordinator and the workers, and the wire between them."""

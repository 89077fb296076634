"""The emulator, and only the emulator: the emulated WAN (net/), the processes that train
over it (runtime/), its backend and resumption. Kept in one folder so that the simulator,
its sibling, plainly never reaches into it, nor it into the simulator; what both share
(plan, policy, run) lies below them."""

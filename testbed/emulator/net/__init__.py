"""The emulated WAN: namespaces, shaped links, the delay line, state files of what a run made,
and their removal."""

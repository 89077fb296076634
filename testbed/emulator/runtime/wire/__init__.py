"""What crosses between the run's processes: framing, messages as typed records, and the
secret a machine proves to join."""

"""What crosses between the run's processes: framing, messages as typed records, the codec, and
the secret a machine proves to join."""

"""What every layer shares: units and field parsing, YAML and input files, closed choices, size
limits, spans (the record of a run), dataclasses to JSON and back, atomic writes."""

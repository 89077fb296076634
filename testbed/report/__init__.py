"""Results files, traces, tables and plots of runs."""

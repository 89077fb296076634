"""The testbed command: one module per group of subcommands (testbed.cli.main holds the group)."""

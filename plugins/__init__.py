"""Built-in policies, installed as `testbed_plugins` and registered through entry points."""

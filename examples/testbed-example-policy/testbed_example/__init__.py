"""An example policy package for testbed: one training policy, one bubble policy."""

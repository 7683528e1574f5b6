"""The `helios` command line."""

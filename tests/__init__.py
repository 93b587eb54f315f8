"""The durably test suite (a package, so helpers import as ``tests.crashkit``)."""

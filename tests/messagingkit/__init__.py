"""Child processes for the crash tests of deterministic waits and workflow messaging."""

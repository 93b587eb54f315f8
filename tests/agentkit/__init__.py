"""Helpers of the agent tests: flows run by child processes, the runner, the harness."""

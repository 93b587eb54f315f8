"""Crash harness: test workflows, a child-process runner, and helpers that count effects.

``flows`` holds the workflows (imported both by the test process and by the
runner child, so both register the same names); ``runner`` is the child entry
point (``python -m tests.crashkit.runner``); ``harness`` spawns, kills and
restarts runners and reads the effects file and the journal.
"""

"""``python -m durably.cli``: the ``durably`` command line."""

from durably.cli import main

main()

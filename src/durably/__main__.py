"""``python -m durably``: the ``durably`` command line, where its script is not on PATH."""

from durably.cli import main

if __name__ == "__main__":
    main()

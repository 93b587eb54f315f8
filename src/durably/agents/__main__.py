"""``python -m durably.agents``: the ``durably`` command line, where the approval commands live."""

from durably.cli import main

if __name__ == "__main__":
    main(prog_name="python -m durably.agents")

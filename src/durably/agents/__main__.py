"""``python -m durably.agents``: the approval commands (see :mod:`durably.agents.cli`)."""

from durably.agents.cli import main

if __name__ == "__main__":
    main(prog_name="python -m durably.agents")

"""`python -m rackflow`: the same as the `rackflow` command."""

from rackflow.cli.main import main

main(prog_name="rackflow")

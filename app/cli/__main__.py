"""`python -m app.cli`: the `infermeter` command."""

from app.cli import main

main()

"""`python -m servinglab` is the `servinglab` command."""

from servinglab.entry import main

main()

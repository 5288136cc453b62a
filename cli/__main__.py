"""`python -m cli ...` = the `afm` console script (e.g. `python -m cli pipeline --config configs/default.yaml`)."""
from cli.app import main

main()

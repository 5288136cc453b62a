"""The `afm` command line (cli/app.py) and its preflight checks (cli/preflight.py): the top layer."""

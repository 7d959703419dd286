"""The `danube-fast` command line: `danube_fast.cli.main` builds the parser and runs a subcommand."""

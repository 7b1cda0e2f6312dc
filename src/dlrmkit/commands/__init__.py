"""One module per `dlrmkit` subcommand, each with a docstring (its --help description),
`add_arguments(parser)` and `run(args) -> int`; dlrmkit.cli lists them in COMMANDS."""

"""The `compiled-llm` command line: subcommands whose engine flags are generated from the
config dataclasses."""

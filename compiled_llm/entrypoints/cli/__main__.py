"""`python -m compiled_llm.entrypoints.cli`: the same as the `compiled-llm` command."""

import sys

from compiled_llm.entrypoints.cli.main import main

sys.exit(main())

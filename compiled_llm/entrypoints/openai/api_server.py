"""vLLM's `python -m vllm.entrypoints.openai.api_server --model MODEL [flags]`: here the same
command line runs `compiled-llm serve`, whose flags are vLLM's spellings."""

from __future__ import annotations

import sys

from compiled_llm.entrypoints.cli import main as cli


def main(argv: list[str] | None = None) -> int:
    """Run `serve` with argv (this process's arguments when None); its exit status."""
    return cli.main(["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())

"""General plugins: the entry points of group `compiled_llm.general_plugins` (vLLM's
`vllm.general_plugins`), each a function called once per process, e.g. to register an
out-of-tree model with `ModelRegistry`. COMPILED_LLM_PLUGINS (comma-separated names) restricts
which ones load, as VLLM_PLUGINS does.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

logger = logging.getLogger(__name__)
PLUGINS_GROUP = "compiled_llm.general_plugins"
ENV_PLUGINS = "COMPILED_LLM_PLUGINS"
_plugins_loaded = False


def allowed_plugins() -> set[str] | None:
    """The names COMPILED_LLM_PLUGINS allows; None when it is unset (all load)."""
    value = os.environ.get(ENV_PLUGINS)
    if value is None:
        return None
    return {name.strip() for name in value.split(",") if name.strip()}


def load_plugins_by_group(group: str) -> dict[str, Callable[[], Any]]:
    """Name -> loaded function for each allowed entry point of `group`; one that fails to
    import is logged and skipped."""
    allowed = allowed_plugins()
    plugins: dict[str, Callable[[], Any]] = {}
    for entry in entry_points(group=group):
        if entry.name in plugins or (allowed is not None and entry.name not in allowed):
            continue  # the first distribution on sys.path wins, as for imports
        try:
            plugins[entry.name] = entry.load()
        except Exception:
            logger.exception("failed to load plugin %s (%s)", entry.name, entry.value)
    if plugins:
        logger.info("plugins of %s: %s", group, ", ".join(plugins))
    return plugins


def load_general_plugins() -> None:
    """Call every allowed general plugin, once per process; one that raises is logged and
    skipped, so a broken plugin never stops the engine."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True  # set first: a plugin that loads the engine must not recurse
    for name, func in load_plugins_by_group(PLUGINS_GROUP).items():
        try:
            func()
        except Exception:
            logger.exception("plugin %s raised; skipped", name)


def reset_plugins() -> None:
    """Let the next load_general_plugins() run the plugins again (for tests)."""
    global _plugins_loaded
    _plugins_loaded = False

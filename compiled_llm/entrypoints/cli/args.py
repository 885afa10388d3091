"""Flags generated from config dataclasses: one flag per field, its help the field's docstring,
its type and choices from the field's hint; `engine_args` builds EngineArgs back from them, so a
new EngineArgs field gets its flag with no edit here."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from typing import Any

from compiled_llm.config import EngineArgs, config_docs, field_choices, split_optional
from compiled_llm.entrypoints.cli.config_file import add_config_flag
from compiled_llm.parallel_config import ParityArgs

# earlier spellings that keep working, and vLLM's where it names a field differently
ENGINE_ARG_ALIASES: dict[str, tuple[str, ...]] = {
    "compile_cache_dir": ("--cache-dir",),
    "compilation_config": ("-cc",),  # also -cc.KEY=VALUE, and -O JSON / -O.KEY=VALUE
    "cudagraph_batch_sizes": ("--batch-sizes",),
    "optimization_level": ("-O",),  # -O0 ... -O3
    "tensor_parallel_size": ("-tp",),
    "pipeline_parallel_size": ("-pp",),
    "enable_expert_parallel": ("-ep",),
    "data_parallel_size": ("-dp",),
}


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser refusing abbreviated flags, as vLLM's does (every subcommand's),
    and taking vLLM's other spellings of a flag (normalize_argv)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # abbreviations let --chat-template match --chat-template-timeout-s
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, on the normalized command line; --help=KEYWORD (a parser without
        subcommands) prints the flags it names and exits."""
        argv = sys.argv[1:] if args is None else list(args)
        keyword = next((arg.partition("=")[2] for arg in argv if arg.startswith("--help=")),
                       None)
        if keyword is not None and self._subparsers is None:
            self._help_matching(keyword)
        return super().parse_known_args(normalize_argv(argv), namespace)

    def _help_matching(self, keyword: str) -> None:
        """vLLM's --help=KEYWORD: `all` is --help, `listgroup` lists the flag groups, a group's
        title shows that group, anything else the flags whose names hold it (- and _ alike)."""
        groups = [g for g in self._action_groups if g._group_actions]
        if keyword == "all":
            self.print_help()
            self.exit(0)
        if keyword == "listgroup":
            self._print_message("".join(f"{g.title}\n" for g in groups), sys.stdout)
            self.exit(0)
        formatter = self._get_formatter()
        chosen = [g for g in groups if (g.title or "").lower() == keyword.lower()]
        wanted = keyword.lower().lstrip("-").replace("_", "-")
        matching = [a for g in groups for a in g._group_actions
                    if any(wanted in flag.lower() for flag in a.option_strings)]
        if not chosen and not matching:
            self.error(f"--help={keyword}: no flag or group matches (--help=listgroup lists "
                       "the groups)")
        for title, actions in ([(g.title, g._group_actions) for g in chosen]
                               or [(f"flags matching {keyword!r}", matching)]):
            formatter.start_section(title)
            formatter.add_arguments(actions)
            formatter.end_section()
        self._print_message(formatter.format_help(), sys.stdout)
        self.exit(0)


def normalize_argv(argv: list[str]) -> list[str]:
    """vLLM's spellings as the flags here read them: --max_model_len is --max-model-len, and
    --speculative-config.method ngram (or .method=ngram) one key of a JSON flag's object, the
    value read as JSON where it parses (5, true) and as a string else. Idempotent."""
    out, position = [], 0
    while position < len(argv):
        arg, position = argv[position], position + 1
        if arg == "--":  # what follows is positional
            return out + [arg, *argv[position:]]
        arg = _compilation_flag(arg, argv[position] if position < len(argv) else "")
        if not arg.startswith("--"):
            out.append(arg)
            continue
        key, equals, value = arg.partition("=")
        head, dot, path = key.partition(".")
        head = "--" + head[2:].replace("_", "-")
        if not dot:
            out.append(head + equals + value)
            continue
        if not path or (not equals and position == len(argv)):  # argparse names it
            out.append(arg)
            continue
        if not equals:
            value, position = argv[position], position + 1
        nested: Any = _json_value(value)
        for part in reversed(path.split(".")):
            nested = {part: nested}
        out += [head, json.dumps(nested)]
    return out


def _compilation_flag(arg: str, following: str) -> str:
    """vLLM's short spellings of --compilation-config: -cc.KEY / -O.KEY (a dotted key), -O
    JSON (-O followed by an object; -O N stays the optimization level)."""
    for short in ("-cc.", "-O."):
        if arg.startswith(short):
            return "--compilation-config." + arg[len(short):]
    if arg == "-O" and following.lstrip().startswith("{"):
        return "--compilation-config"
    if arg.startswith("-O{"):
        return "--compilation-config=" + arg[2:]
    return arg


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _deep_merge(base: dict, extra: dict) -> dict:
    merged = dict(base)
    for key, value in extra.items():
        old = merged.get(key)
        merged[key] = _deep_merge(old, value) if isinstance(old, dict) and isinstance(
            value, dict) else value
    return merged


class JsonObjectAction(argparse.Action):
    """A JSON object flag given more than once (--speculative-config.method ngram
    --speculative-config.num_speculative_tokens 3) merges its objects, later keys winning."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        current = getattr(namespace, self.dest, None)
        merged = _deep_merge(current, values) if isinstance(current, dict) else values
        setattr(namespace, self.dest, merged)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default unless it is None or the help already says it (the field docs
    say what None means)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or "(default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def json_object(text: str) -> dict:
    """argparse type for dict fields: a JSON object, e.g. '{"enable_silu_mul": false}'."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def flag_name(field_name: str) -> str:
    """The flag a field gets: max_model_len -> --max-model-len."""
    return "--" + field_name.replace("_", "-")


def _type_kwargs(cls: type, field: dataclasses.Field, hint: object) -> dict[str, Any]:
    """add_argument's type, nargs, choices or action for one field, from its type hint (or
    the parser in its metadata, for a hint no flag type spells, such as `int | str`)."""
    if field.metadata.get("repeat"):  # given once per value (--middleware A --middleware B)
        return {"type": str, "action": "append"}
    if "parse" in field.metadata:  # a dict field's objects merge (dotted keys)
        merge = {"metavar": "JSON", "action": JsonObjectAction} if split_optional(hint)[
            0] is dict else {}
        return {"type": field.metadata["parse"], **merge}
    choices = field_choices(cls).get(field.name)
    if choices is not None:  # None cannot be spelled on the command line: leave it out
        values = [c for c in choices if c is not None]
        return {"type": type(values[0]), "choices": values}
    inner, _ = split_optional(hint)
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    if inner is bool:
        return {"action": argparse.BooleanOptionalAction}
    if inner in (int, float, str):
        return {"type": inner}
    if inner is dict or origin is dict:
        return {"type": json_object, "metavar": "JSON", "action": JsonObjectAction}
    if origin is list and len(args) == 1 and args[0] in (int, float, str):
        return {"type": args[0], "nargs": "+", "metavar": args[0].__name__.upper()}
    raise TypeError(f"{cls.__name__}.{field.name}: no flag for type {hint!r}")


def _default_kwargs(field: dataclasses.Field) -> dict[str, Any]:
    """The dataclass's default; a default_factory field's flag has none (SUPPRESS leaves it
    out of the namespace), so the factory runs when the dataclass is built, as it would."""
    if field.default is not dataclasses.MISSING:
        return {"default": field.default}
    if field.default_factory is not dataclasses.MISSING:
        return {"default": argparse.SUPPRESS}
    return {"required": True}


def add_dataclass_args(parser: argparse.ArgumentParser, cls: type, *,
                       exclude: tuple[str, ...] = (),
                       aliases: dict[str, tuple[str, ...]] | None = None,
                       title: str | None = None) -> None:
    """One flag per field of dataclass cls but `exclude`, in a group titled `title`; each
    flag's dest is the field's name, so `dataclass_from(cls, namespace)` rebuilds cls."""
    hints, docs = typing.get_type_hints(cls), config_docs(cls)
    group = parser.add_argument_group(title or f"{cls.__name__} options")
    for field in dataclasses.fields(cls):
        if field.name in exclude:
            continue
        flags = (flag_name(field.name), *(aliases or {}).get(field.name, ()))
        group.add_argument(*flags, dest=field.name,
                           help=docs.get(field.name, "").replace("%", "%%"),
                           **_type_kwargs(cls, field, hints[field.name]),
                           **_default_kwargs(field))


def dataclass_from(cls: type, namespace: argparse.Namespace, **overrides: Any) -> Any:
    """cls built from the namespace's attributes named like its fields (one absent, a
    default_factory flag not given, takes the dataclass's default), then `overrides`."""
    values = {field.name: getattr(namespace, field.name) for field in dataclasses.fields(cls)
              if hasattr(namespace, field.name)}
    return cls(**{**values, **overrides})


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """The engine flags every subcommand that builds an engine takes: one per EngineArgs
    field, vLLM's spellings, plus the aliases in ENGINE_ARG_ALIASES, and --config."""
    parity = tuple(f.name for f in dataclasses.fields(ParityArgs))
    add_dataclass_args(parser, EngineArgs, aliases=ENGINE_ARG_ALIASES, exclude=parity,
                       title="engine options (EngineArgs)")
    add_dataclass_args(parser, ParityArgs, aliases=ENGINE_ARG_ALIASES,
                       title="vLLM's options that change nothing here, or are refused "
                             "(ParityArgs)")
    add_config_flag(parser)


def engine_args(namespace: argparse.Namespace) -> EngineArgs:
    """EngineArgs from a namespace that add_engine_args' flags filled."""
    return dataclass_from(EngineArgs, namespace)

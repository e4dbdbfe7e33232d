"""The reference pages' generated parts, made from the code itself so they cannot drift from it:
every configuration key with its default and range (from `lowtide.config.schema` and its rules),
every command and flag of `lowtide` (from its argparse parser), the gRPC API (from the comments
in `protos/`) and the Helm chart's values (from its values.yaml). `scripts/mkdocs_hooks.py` puts
them into the pages at build time, where a page says `<!-- generated: NAME -->`."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import os
import subprocess
import sys
import tempfile
import typing
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parent.parent
# The modules declaring the configuration's sections (lowtide.config.schema and what it imports).
SCHEMA = (ROOT / "lowtide" / "config" / "schema.py", ROOT / "lowtide" / "config" / "signals.py")
PROTOS = ROOT / "protos"


def _cell(text: str) -> str:
    """Text made safe for one cell of a Markdown table."""
    return " ".join(text.split()).replace("|", "\\|")


def _show(value: Any) -> str:
    from lowtide.config.rules import show

    if value is None:
        return "unset"
    if isinstance(value, tuple):
        return "[" + ", ".join(repr(v).replace("'", '"') for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return show(value)


def describe_rule(rule: Callable[[Any], str | None] | None) -> str:
    """What a key's rule accepts, in words: `within` and `one_of` by the bounds they close over,
    the named rules by their docstring."""
    if rule is None:
        return ""
    from lowtide.config.rules import show

    captured = inspect.getclosurevars(rule).nonlocals
    if "low" in captured and "high" in captured:
        low, high = show(captured["low"]), show(captured["high"])
        return f"above {low}, at most {high}" if captured.get("above") else f"{low} to {high}"
    if "choices" in captured:
        return "one of " + ", ".join(f"`{c}`" for c in captured["choices"])
    doc = inspect.getdoc(rule)
    if doc:
        return doc.splitlines()[0].rstrip(".")
    return {"finite": "any finite number", "not_empty": "not empty", "database_url": "a PostgreSQL URL"}.get(
        rule.__name__, rule.__name__.replace("_", " ")
    )


def _field_comments() -> dict[tuple[str, str], str]:
    """The comment lines right above each field of each class in the schema's sources."""
    comments: dict[tuple[str, str], str] = {}
    for path in SCHEMA:
        comments |= _comments_in(path.read_text())
    return comments


def _comments_in(source: str) -> dict[tuple[str, str], str]:
    lines = source.splitlines()
    comments: dict[tuple[str, str], str] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for statement in node.body:
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                above: list[str] = []
                index = statement.lineno - 2
                while index >= 0 and lines[index].strip().startswith("#"):
                    above.insert(0, lines[index].strip().lstrip("#").strip())
                    index -= 1
                comments[(node.name, statement.target.id)] = " ".join(above)
    return comments


def _kind(annotation: Any) -> str:
    hints = typing.get_args(annotation) or (annotation,)
    names = {timedelta: "duration", int: "integer", float: "number", str: "string", bool: "boolean", tuple: "list"}
    for hint in hints:
        origin = typing.get_origin(hint) or hint
        if origin in names:
            return names[origin]
    return "table"


def _key_rows(cls: type[Any], comments: dict[tuple[str, str], str]) -> Iterator[str]:
    from lowtide.config.rules import _RULE

    hints = typing.get_type_hints(cls)
    for spec in dataclasses.fields(cls):
        if spec.default is not dataclasses.MISSING:
            default = _show(spec.default)
        elif spec.default_factory is not dataclasses.MISSING:
            default = _show(spec.default_factory())
        else:
            default = "required"
        accepts = describe_rule(spec.metadata.get(_RULE))
        what = comments.get((cls.__name__, spec.name), "")
        yield (f"| `{spec.name}` | {_kind(hints[spec.name])} | `{_cell(default)}` | {_cell(accepts)} | {_cell(what)} |")


def configuration_keys() -> str:
    """Every section and key of the configuration: type, default, accepted range, and the comment
    the schema gives it; the environment variable of each plain key."""
    from lowtide.config import schema
    from lowtide.config.rules import MARGINS

    comments = _field_comments()
    tables: list[tuple[str, type[Any], str]] = [
        (f"[{name}]", cls, f"`LOWTIDE_{name.upper()}_<KEY>`") for name, cls in schema.SECTIONS.items()
    ]
    tables += [
        ("[auth]", schema.AuthConfig, "`LOWTIDE_AUTH=off` turns it off; the file for the rest"),
        ("[[auth.tokens]]", schema.TokenEntry, f"the file only; `role` is one of {', '.join(schema.ROLES)}"),
        ("[types.NAME]", schema.TypeConfig, "the file only"),
        ("[types.NAME] adaptive_concurrency", schema.AdaptiveConcurrencyConfig, "the file only, as an inline table"),
        ("[pools.NAME]", schema.PoolConfig, "the file only"),
        ("[queues.NAME]", schema.QueueConfig, "the file only"),
        ("[signals.NAME]", schema.SignalDefinition, "the file only"),
    ]
    out: list[str] = []
    for title, cls, env in tables:
        doc = inspect.getdoc(cls)
        out.append(f"### `{title}`\n")
        if doc and not doc.startswith(cls.__name__ + "("):
            out.append(" ".join(doc.split()) + "\n")
        out.append(f"Environment: {env}.\n")
        out.append("| key | type | default | accepts | what |\n| --- | --- | --- | --- | --- |")
        out.extend(_key_rows(cls, comments))
        out.append("")
    out.append("### `[resources]`\n")
    out.append("Named capacities (`gpu = 2`), integers; a task asks for amounts of them. The file only.\n")
    out.append("### Keys bound to another\n")
    out.append("| key | must be at least | why |\n| --- | --- | --- |")
    for section, name, other, factor, why in MARGINS:
        times = f"{factor} x " if factor != 1 else ""
        out.append(f"| `[{section}] {name}` | {times}`{other}` | {_cell(why)} |")
    out.append("")
    return "\n".join(out)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help_of(parser: argparse.ArgumentParser, name: str) -> str:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if choice.dest == name:
                    return choice.help or ""
    return ""


def _options(parser: argparse.ArgumentParser) -> Iterator[str]:
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.option_strings:
            names = ", ".join(f"`{o}`" for o in action.option_strings)
            if action.nargs != 0:
                names += f" `{action.metavar or action.dest.upper()}`"
        else:
            names = f"`{action.metavar or action.dest.upper()}`" + ("…" if action.nargs in ("*", "+") else "")
        text = action.help if action.help and action.help != argparse.SUPPRESS else ""
        if action.choices and not isinstance(action.choices, dict):
            text += f" (one of {', '.join(f'`{c}`' for c in action.choices)})"
        if action.default not in (None, False, argparse.SUPPRESS) and action.option_strings:
            text += f" (default: `{action.default}`)"
        yield f"| {names} | {_cell(text)} |"


def _commands(parser: argparse.ArgumentParser, path: list[str], help_text: str) -> Iterator[str]:
    children = _subcommands(parser)
    rows = list(_options(parser))
    if path and (rows or not children):
        yield f"### `{' '.join(path)}`\n"
        description = parser.description or help_text
        if description:
            yield " ".join(description.split()) + "\n"
        yield "```text\n" + parser.format_usage().strip() + "\n```\n"
        if rows:
            yield "| argument | what |\n| --- | --- |"
            yield from rows
            yield ""
    for name, child in children.items():
        yield from _commands(child, [*path, name], _help_of(parser, name))


def cli_commands() -> str:
    """Every command of `lowtide`, its usage and each of its arguments, from the parser itself."""
    from lowtide.cli import _parser

    # argparse wraps usage lines at the terminal's width: the page's must not depend on it.
    os.environ["COLUMNS"] = "100"
    parser = _parser()
    parser.prog = "lowtide"
    return "\n".join(_commands(parser, ["lowtide"], parser.description or ""))


def _descriptors() -> descriptor_pb2.FileDescriptorSet:
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        args = [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTOS}", f"-I{include}"]
        args += ["--include_source_info", f"--descriptor_set_out={out}", *protos]
        subprocess.run(args, check=True, capture_output=True)
        result = descriptor_pb2.FileDescriptorSet()
        result.ParseFromString(out.read_bytes())
        return result


def _comment(text: str) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines())


def grpc_api() -> str:
    """Each service with its methods, each message with its fields and each enum with its values,
    described by the leading comments of `protos/`."""
    out: list[str] = []
    # lowtide's own files first, KEDA's interface last.
    for file in sorted(_descriptors().file, key=lambda f: (f.name.startswith("externalscaler"), f.name)):
        comments = {tuple(loc.path): _comment(loc.leading_comments) for loc in file.source_code_info.location}
        out.append(f"## `{file.name}`\n")
        if file.package:
            out.append(f"Package `{file.package}`.\n")
        for s, service in enumerate(file.service):
            out.append(f"### service `{service.name}`\n")
            if comments.get((6, s)):
                out.append(comments[(6, s)] + "\n")
            out.append("| method | request → response | what |\n| --- | --- | --- |")
            for m, method in enumerate(service.method):
                request = ("stream " if method.client_streaming else "") + method.input_type.rsplit(".", 1)[-1]
                response = ("stream " if method.server_streaming else "") + method.output_type.rsplit(".", 1)[-1]
                out.append(
                    f"| `{method.name}` | `{request}` → `{response}` | {_cell(comments.get((6, s, 2, m), ''))} |"
                )
            out.append("")
        for m, message in enumerate(file.message_type):
            out.extend(_message(message, (4, m), comments, message.name))
        for e, enum in enumerate(file.enum_type):
            out.extend(_enum(enum, (5, e), comments, enum.name))
    return "\n".join(out)


_TYPES = {number: name[len("TYPE_") :].lower() for name, number in descriptor_pb2.FieldDescriptorProto.Type.items()}


def _message(
    message: descriptor_pb2.DescriptorProto, path: tuple[int, ...], comments: dict[tuple[int, ...], str], name: str
) -> Iterator[str]:
    if message.options.map_entry:
        return
    yield f"### message `{name}`\n"
    if comments.get(path):
        yield comments[path] + "\n"
    if message.field:
        yield "| field | type | what |\n| --- | --- | --- |"
        for f, field in enumerate(message.field):
            kind = field.type_name.rsplit(".", 1)[-1] if field.type_name else _TYPES[field.type]
            if field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED:
                kind = f"repeated {kind}"
            yield f"| `{field.name}` | `{kind}` | {_cell(comments.get((*path, 2, f), ''))} |"
        yield ""
    for n, nested in enumerate(message.nested_type):
        yield from _message(nested, (*path, 3, n), comments, f"{name}.{nested.name}")
    for e, enum in enumerate(message.enum_type):
        yield from _enum(enum, (*path, 4, e), comments, f"{name}.{enum.name}")


def _enum(
    enum: descriptor_pb2.EnumDescriptorProto, path: tuple[int, ...], comments: dict[tuple[int, ...], str], name: str
) -> Iterator[str]:
    yield f"### enum `{name}`\n"
    if comments.get(path):
        yield comments[path] + "\n"
    yield "| value | number | what |\n| --- | --- | --- |"
    for v, value in enumerate(enum.value):
        yield f"| `{value.name}` | {value.number} | {_cell(comments.get((*path, 2, v), ''))} |"
    yield ""


def helm_values() -> str:
    """The Helm chart's values.yaml as it is, every value with the comment that documents it."""
    values = (ROOT / "deploy" / "helm" / "lowtide" / "values.yaml").read_text()
    return "```yaml\n" + values.rstrip("\n") + "\n```\n"


def _client_readme(folder: str) -> Callable[[], str]:
    def readme() -> str:
        """A client library's own README (what its package ships), one heading level down."""
        text = (ROOT / "clients" / folder / "README.md").read_text()
        return "\n".join("#" + line if line.startswith("#") else line for line in text.splitlines()) + "\n"

    return readme


GENERATED: dict[str, Callable[[], str]] = {
    "client-python": _client_readme("python"),
    "client-node": _client_readme("node"),
    "client-go": _client_readme("go"),
    "helm-values": helm_values,
    "configuration-keys": configuration_keys,
    "cli-commands": cli_commands,
    "grpc-api": grpc_api,
}

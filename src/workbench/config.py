"""Typed parameters loaded from YAML files (msgspec structs; every error names the key).

`load_yaml_params` turns any YAML mapping into a msgspec struct and reports problems as one
line naming the file, the line and the key path in the YAML's own spelling (the line of the
key, or of the mapping that misses it):

    params/datasets.yaml:21: datasets[1].max_samples: expected int, got str
    params/datasets.yaml:9: sampling.topp: unknown key (known: max_new_tokens, temperature, ...)
    params/datasets.yaml: invalid YAML at line 7, column 3: mapping values are not allowed here

`load_manifest` loads the dataset manifest of a generation job, checks what the types cannot
(safe unique dataset names, a known model profile, files that exist), resolves every path
relative to the YAML file and gives every dataset the top level's `order` and `dedup` unless it
sets its own. Each loaded dataset keeps its `origin` (file, index, key lines), so an error
about one of its rows can name the manifest key behind it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec
import yaml

from workbench.errors import ConfigError
from workbench.modes import deployment_mix
from workbench.profiles import get_profile

__all__ = [
    "CHAT_INPUTS",
    "CONTEXT_FIT_MIN_TOKENS",
    "DATASET_NAME_PATTERN",
    "DEDUP_THRESHOLD",
    "ContextFit",
    "DatasetOrigin",
    "DatasetSpec",
    "DedupMode",
    "InputMode",
    "Manifest",
    "Mode",
    "Render",
    "Sampling",
    "SamplingOverride",
    "Turns",
    "key_lines",
    "load_manifest",
    "load_yaml_params",
    "load_yaml_text",
    "override",
    "with_line",
]

T = TypeVar("T")

DATASET_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MODE_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=,-]{0,63}$")

InputMode = Literal["input_ids", "text", "messages", "conversations"]
CHAT_INPUTS = ("messages", "conversations")  # the input modes rendered with a chat template
# Which assistant turns of a conversation are generated: the last one (after the row's
# history), or each one in order against the model's own earlier turns (workbench.chat).
Turns = Literal["last", "each"]
# Whose rendering of a conversation a chat dataset's prompts follow: the tokenizer's chat
# template on the client (sent to /generate as ids), or the server's (sent to
# /v1/chat/completions as messages: what a deployment behind that endpoint feeds the model).
Render = Literal["tokenizer", "server"]
# What a turn cut at max_new_tokens does to a turns: each conversation: ends it (the turns
# before it kept), or stays in the history as it was cut and the conversation goes on.
Truncated = Literal["end", "continue"]
Order = Literal["random", "file"]  # the order a dataset's prompts are sent in
# What a request refused because prompt + max_new_tokens exceed the context becomes: a failed
# prompt, or sent again once with max_new_tokens cut to fit (workbench.generate.context_fit).
ContextFit = Literal["fail", "reduce_generation"]
CONTEXT_FIT_MIN_TOKENS = 256  # the fewest new tokens a cut request may keep, by default
# Which duplicate prompts a dataset skips before sending (workbench.generate.dedup): none, those
# with the same content, or those whose MinHash similarity reaches the manifest's threshold.
DedupMode = Literal["exact", "near", "off"]
# As the YAML writes it: YAML 1.1 reads a bare `off` (or `no`) as false, which means "off".
_DedupSetting = DedupMode | bool
# The estimated Jaccard similarity from which two prompts are near copies, on what their
# dataset's template (system prompt, tool schemas, chat markers) leaves: sketch.PROMPT_THRESHOLD.
DEDUP_THRESHOLD = 0.55
Threshold = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
Temperature = Annotated[float, msgspec.Meta(ge=0.0)]
TopP = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
Positive = Annotated[int, msgspec.Meta(ge=1)]
Concurrency = Positive | Literal["auto"]  # requests in flight: a fixed cap, or steered


class Sampling(msgspec.Struct, forbid_unknown_fields=True):
    """Sampling parameters sent with every request."""

    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: int = -1  # -1 (off) or >= 1: checked by load_manifest
    max_new_tokens: Positive = 2048

    def to_sglang(self) -> dict[str, float | int]:
        """SGLang's `sampling_params`, every key explicit (newer servers fill unset keys from
        the model's generation config)."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_new_tokens": self.max_new_tokens,
        }


class SamplingOverride(msgspec.Struct, forbid_unknown_fields=True):
    """A dataset's changes to the manifest's sampling; None inherits."""

    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: int | None = None
    max_new_tokens: Positive | None = None


Weight = Annotated[float, msgspec.Meta(gt=0.0)]


class Mode(msgspec.Struct, forbid_unknown_fields=True):
    """One mode of a dataset that mixes modes (`modes`): its name (on every record it gives),
    its weight (relative to the others'), the chat-template arguments it sets over the
    dataset's, and its sampling overrides over the dataset's."""

    name: str
    weight: Weight = 1.0
    chat_template_kwargs: dict[str, Any] = {}
    sampling: SamplingOverride | None = None


class ModesFrom(msgspec.Struct, forbid_unknown_fields=True):
    """`modes: {from: FILE}`: the modes and weights of a sample of a deployment's
    chat-completion request bodies (JSONL; :func:`workbench.modes.deployment_mix`)."""

    from_: str = msgspec.field(name="from")


_ModesSetting = list[Mode] | ModesFrom


class DatasetOrigin(msgspec.Struct, frozen=True):
    """Where a dataset is written in its manifest: the file (as given), the dataset's index
    in `datasets` and the YAML line of the item (`item_line`) and of each key it sets."""

    source: str
    index: int
    item_line: int | None = None
    lines: dict[str, int] = {}

    def setting(self, key: str, value: object) -> str:
        """The manifest setting `key` as a message names it: ``datasets[2].id_field: id,
        params/datasets.yaml:12``, or for a key left out ``datasets[2].id_field defaults to
        sample_id, params/datasets.yaml:10`` (the item's line)."""
        path = f"datasets[{self.index}].{key}"
        line = self.lines.get(key)
        if line is not None:
            return f"{path}: {value}, {self.source}:{line}"
        where = f"{self.source}:{self.item_line}" if self.item_line else self.source
        return f"{path} defaults to {value}, {where}"


class _DatasetEntry(msgspec.Struct, forbid_unknown_fields=True):
    """One dataset as the manifest YAML writes it."""

    name: str
    path: str
    input: InputMode
    id_field: str = "sample_id"
    max_samples: Positive | None = None
    max_tokens: Positive | None = None
    sampling: SamplingOverride | None = None
    chat_template_kwargs: dict[str, Any] = {}
    tokenizer: str | None = None
    trust_remote_code: bool = False
    order: Order | None = None  # None: the manifest's
    context_fit: ContextFit = "fail"
    context_fit_min_tokens: Positive | None = None  # None: CONTEXT_FIT_MIN_TOKENS
    dedup: _DedupSetting | None = None  # None: the manifest's
    turns: Turns | None = None  # None: the manifest's
    tools_field: str = "tools"  # the row's tool schemas (chat inputs), passed as `tools`
    render: Render = "tokenizer"  # chat inputs: whose rendering of the history is sent
    truncated: Truncated = "end"  # turns: each: a turn cut at max_new_tokens ends it or not
    modes: _ModesSetting | None = None  # None: the manifest's (none: one mode)

    def dedup_mode(self) -> DedupMode:
        """The dataset's dedup mode ("off" for a spec that sets none)."""
        mode = self.dedup
        return "off" if mode is None or isinstance(mode, bool) else mode

    def min_generation_tokens(self) -> int:
        """The fewest max_new_tokens a request cut to fit the context may keep."""
        return self.context_fit_min_tokens or CONTEXT_FIT_MIN_TOKENS


class DatasetSpec(_DatasetEntry, forbid_unknown_fields=True):
    """One dataset of the manifest.

    After `load_manifest`, `path` and `tokenizer` are absolute (`tokenizer` falls back to the
    manifest's), `trust_remote_code` is true when the dataset or the manifest says so, `order`
    and `dedup` are the dataset's or else the manifest's, and `origin` says where the manifest
    writes it (None for a spec built in code).
    """

    origin: DatasetOrigin | None = None
    modes_source: str | None = None  # the deployment sample `modes: {from}` read, absolute

    def mode_list(self) -> list[Mode]:
        """The dataset's modes ([] for a dataset that mixes none)."""
        return self.modes if isinstance(self.modes, list) else []

    def mode(self, name: str | None) -> Mode | None:
        """The mode called `name` (None for none, or an unknown name)."""
        return next((m for m in self.mode_list() if m.name == name), None)

    def template_kwargs(self, mode: str | None = None) -> dict[str, Any]:
        """The chat-template arguments of a prompt of `mode`: the mode's over the dataset's."""
        chosen = self.mode(mode)
        if chosen is None or not chosen.chat_template_kwargs:
            return self.chat_template_kwargs
        return {**self.chat_template_kwargs, **chosen.chat_template_kwargs}


class _ManifestFile(msgspec.Struct, forbid_unknown_fields=True):
    """The manifest YAML as written."""

    model_profile: str
    datasets: list[_DatasetEntry]
    sampling: Sampling = msgspec.field(default_factory=Sampling)
    tokenizer: str | None = None
    trust_remote_code: bool = False
    order: Order = "random"
    concurrency: Concurrency | None = None
    dedup: _DedupSetting = "off"
    dedup_threshold: Threshold | None = None  # None: DEDUP_THRESHOLD
    turns: Turns = "last"
    modes: _ModesSetting | None = None


class Manifest(msgspec.Struct, kw_only=True):
    """A loaded, checked dataset manifest; `source` is the YAML file it came from.
    `dedup_threshold` is the near-duplicate threshold of every dataset with ``dedup: near``."""

    source: str
    model_profile: str
    sampling: Sampling
    datasets: list[DatasetSpec]
    tokenizer: str | None = None
    concurrency: Concurrency | None = None
    dedup_threshold: float = DEDUP_THRESHOLD

    def dataset(self, name: str) -> DatasetSpec:
        """The dataset called `name`, or a ConfigError listing the known names."""
        for ds in self.datasets:
            if ds.name == name:
                return ds
        known = ", ".join(ds.name for ds in self.datasets)
        raise ConfigError("datasets", f"no dataset named {name!r} (known: {known})", self.source)

    def sampling_for(self, ds: DatasetSpec) -> Sampling:
        """The manifest's sampling with the dataset's overrides applied."""
        if ds.sampling is None:
            return self.sampling
        return override(self.sampling, ds.sampling)

    def mode_sampling(self, ds: DatasetSpec, mode: str | None) -> Sampling:
        """The dataset's sampling with the overrides of its mode called `mode`."""
        sampling = self.sampling_for(ds)
        chosen = ds.mode(mode)
        if chosen is None or chosen.sampling is None:
            return sampling
        return override(sampling, chosen.sampling)


def override(sampling: Sampling, changes: SamplingOverride) -> Sampling:
    """`sampling` with the values `changes` sets."""
    values = {field: value for field in changes.__struct_fields__
              if (value := getattr(changes, field)) is not None}
    return msgspec.structs.replace(sampling, **values) if values else sampling


# ------------------------------------------------------------------------------ YAML


# Nested aliases (`*name`) grow a small file into a huge document ("billion laughs"): a file
# whose aliases expand it past this many nodes is refused before anything is built.
MAX_ALIASED_NODES = 100_000


class _AliasBomb(yaml.YAMLError):
    """A file whose aliases expand past MAX_ALIASED_NODES: the first alias and its line."""

    def __init__(self, alias: str, line: int) -> None:
        self.alias, self.line = alias, line
        super().__init__(alias)


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses a key repeated in one mapping, and aliases that
    expand the document past MAX_ALIASED_NODES nodes."""

    first_alias: tuple[str, int] | None = None  # (name, line) of the document's first alias

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.first_alias is None and self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            self.first_alias = (str(event.anchor), event.start_mark.line + 1)
        return super().compose_node(parent, index)  # type: ignore[no-any-return]

    def compose_document(self) -> yaml.Node | None:
        node = super().compose_document()
        if self.first_alias is not None and _expanded_size(node) > MAX_ALIASED_NODES:
            raise _AliasBomb(*self.first_alias)
        return node  # type: ignore[no-any-return]

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if (
                not isinstance(key_node, yaml.ScalarNode)
                or key_node.tag == "tag:yaml.org,2002:merge"
            ):
                continue
            if key_node.value in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                )
            seen.add(key_node.value)
        return super().construct_mapping(node, deep)


def _expanded_size(root: yaml.Node | None) -> int:
    """The document's node count with every alias (its anchor's node, met again) written out."""
    sizes: dict[int, int] = {}
    pending: list[tuple[yaml.Node, bool]] = [(root, False)] if root is not None else []
    while pending:
        node, children_done = pending.pop()
        if id(node) in sizes:
            continue
        children = _children(node)
        if children_done:
            sizes[id(node)] = min(1 + sum(sizes[id(c)] for c in children), 1 << 62)
        else:
            pending.append((node, True))
            pending.extend((c, False) for c in children if id(c) not in sizes)
    return sizes.get(id(root), 0)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def load_yaml_text(text: str, key: str, source: str) -> Any:
    """One YAML value (a `-p key=value` override) read as parameter files are: safe, no
    repeated keys, no aliases expanding past MAX_ALIASED_NODES (a ConfigError naming key)."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except _AliasBomb as exc:
        raise ConfigError(key, _alias_message(exc), source) from None


def _alias_message(exc: _AliasBomb) -> str:
    return (f"YAML aliases (*{exc.alias}) expand past {MAX_ALIASED_NODES} values: parameter "
            "files accept only small aliases")


def _read_yaml_mapping(path: Path, source: str) -> dict[str, Any]:
    """The file's top-level mapping, or a ConfigError naming the file (and line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("", "file not found", source) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("", f"cannot read the file: {exc}", source) from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except _AliasBomb as exc:
        raise ConfigError("", _alias_message(exc), source, exc.line) from None
    except yaml.MarkedYAMLError as exc:
        raise ConfigError("", _yaml_error_message(exc), source) from None
    except yaml.YAMLError as exc:
        raise ConfigError("", f"invalid YAML: {exc}", source) from None
    if data is None:
        raise ConfigError("", "empty file: expected a mapping of keys", source)
    if not isinstance(data, dict):
        raise ConfigError("", f"expected a mapping of keys, got {_yaml_kind(data)}", source)
    return data


def _yaml_error_message(exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"invalid YAML{where}: {exc.problem or exc.context}"


def _yaml_kind(value: object) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    return type(value).__name__


def load_yaml_params(path: str | Path, struct_type: type[T], *, source: str | None = None) -> T:
    """Load a YAML mapping into `struct_type`.

    `source` is how messages name the file (default: `path` as given). Type errors, values out
    of range, missing and unknown keys raise a ConfigError naming the key path.
    """
    source = source if source is not None else str(path)
    data = _read_yaml_mapping(Path(path), source)
    try:
        return msgspec.convert(data, struct_type, str_keys=True)
    except msgspec.ValidationError as exc:
        raise with_line(_config_error(str(exc), data, struct_type, source), Path(path)) from None


# ------------------------------------------------------------------------ line numbers


def key_lines(text: str) -> dict[str, int]:
    """1-based line of every key path of a YAML text (``datasets[1].max_samples``: the line of
    the key; ``datasets[1]``: the line where the item starts); empty when it does not parse."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    found: dict[str, int] = {}
    pending: list[tuple[list[str | int], yaml.Node]] = [([], root)] if root is not None else []
    while pending:
        parts, node = pending.pop()
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    found[_format_path([*parts, key.value])] = key.start_mark.line + 1
                    pending.append(([*parts, key.value], value))
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                found[_format_path([*parts, index])] = item.start_mark.line + 1
                pending.append(([*parts, index], item))
    return found


def _line_for(key: str, lines: dict[str, int]) -> int | None:
    """The line of key, else of its nearest parent that is in the file."""
    parts = _parse_path("." + key)
    while parts:
        line = lines.get(_format_path(parts))
        if line is not None:
            return line
        parts = parts[:-1]
    return None


def with_line(error: ConfigError, path: Path) -> ConfigError:
    """error with the YAML line of its key after the file name (unchanged when the file has
    no such key or already names a line)."""
    if not error.key or error.line is not None or error.source != str(path):
        return error
    try:
        lines = key_lines(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return error
    line = _line_for(error.key, lines)
    return error if line is None else ConfigError(error.key, error.message, error.source, line)


# ------------------------------------------------------------------- msgspec messages

_AT = re.compile(r"^(?P<head>.*?) - at `(?P<keypos>key` in `)?\$(?P<path>[^`]*)`$")
_PATH_PART = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")
_EXPECTED = re.compile(r"^Expected `(?P<want>[^`]+)`(?:, got `(?P<got>[^`]+)`)?(?P<rest>.*)$")
_FIELD = re.compile(r"^Object (?P<what>missing required|contains unknown) field `(?P<name>[^`]+)`$")
_ENUM = re.compile(r"^Invalid enum value (?P<value>.+)$")
_TYPE_NAMES = {"object": "mapping", "array": "list"}


def _config_error(message: str, data: Any, struct_type: type, source: str) -> ConfigError:
    """A msgspec validation message turned into a ConfigError in the YAML's terms."""
    match = _AT.match(message)
    head, path_text = (match["head"], match["path"]) if match else (message, "")
    parts = _parse_path(path_text)
    if match and match["keypos"]:
        bad = next(k for k in _value_at(data, parts) if not isinstance(k, str))
        return ConfigError(_format_path(parts), f"key {bad!r} must be a string", source)
    field = _FIELD.match(head)
    if field:
        key = _format_path([*parts, field["name"]])
        if field["what"] == "missing required":
            return ConfigError(key, "missing required key", source)
        known = ", ".join(_known_keys(struct_type, parts))
        return ConfigError(key, f"unknown key (known: {known})", source)
    enum = _ENUM.match(head)
    if enum:
        allowed = ", ".join(_literal_values(struct_type, parts))
        return ConfigError(
            _format_path(parts),
            f"invalid value {enum['value']} (expected one of: {allowed})",
            source,
        )
    return ConfigError(_format_path(parts), _describe(head, _value_at(data, parts)), source)


def _describe(head: str, value: Any) -> str:
    """'Expected `int | null`, got `str`' -> 'expected int, got str'; constraint failures get
    the offending value appended."""
    expected = _EXPECTED.match(head)
    if not expected:
        return head[:1].lower() + head[1:]
    want = " or ".join(_TYPE_NAMES.get(t, t) for t in expected["want"].split(" | ") if t != "null")
    if expected["got"]:
        return f"expected {want or 'null'}, got {_TYPE_NAMES.get(expected['got'], expected['got'])}"
    return f"expected {want}{expected['rest']}, got {value!r}"


def _parse_path(text: str) -> list[str | int]:
    return [name if name else int(index) for name, index in _PATH_PART.findall(text)]


def _format_path(parts: list[str | int]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _value_at(data: Any, parts: list[str | int]) -> Any:
    for part in parts:
        data = data[part]
    return data


def _type_at(struct_type: type, parts: list[str | int]) -> msgspec.inspect.Type:
    """The msgspec type found at a key path (optional types unwrapped)."""
    current = msgspec.inspect.type_info(struct_type)
    for part in parts:
        current = _unwrap(current, part)
        if isinstance(part, int) and isinstance(current, msgspec.inspect.ListType):
            current = current.item_type
        elif isinstance(current, msgspec.inspect.StructType):
            current = next(f.type for f in current.fields if f.encode_name == part)
    return _unwrap(current)


def _unwrap(info: msgspec.inspect.Type, part: str | int | None = None) -> msgspec.inspect.Type:
    """The type without None; of a union of a list and a struct (e.g. `modes`), the member
    the next key path `part` goes into (an index: the list, a key: the struct)."""
    if isinstance(info, msgspec.inspect.UnionType):
        kept = [t for t in info.types if not isinstance(t, msgspec.inspect.NoneType)]
        if len(kept) == 1:
            return kept[0]
        if part is not None:
            kind = msgspec.inspect.ListType if isinstance(part, int) else msgspec.inspect.StructType
            return next((t for t in kept if isinstance(t, kind)), info)
    return info


def _known_keys(struct_type: type, parts: list[str | int]) -> list[str]:
    info = _unwrap(_type_at(struct_type, parts), "")
    fields = info.fields if isinstance(info, msgspec.inspect.StructType) else ()
    return sorted(f.encode_name for f in fields)


def _literal_values(struct_type: type, parts: list[str | int]) -> list[str]:
    info = _type_at(struct_type, parts)
    if isinstance(info, msgspec.inspect.UnionType):  # e.g. concurrency: a number or "auto"
        kinds = [_kind_name(t) for t in info.types]
        return [k for k in kinds if k]
    values = info.values if isinstance(info, msgspec.inspect.LiteralType) else ()
    return [str(v) for v in values]


def _kind_name(info: Any) -> str:
    if isinstance(info, msgspec.inspect.LiteralType):
        return ", ".join(str(v) for v in info.values)
    if isinstance(info, msgspec.inspect.IntType):
        return "a whole number" + (f" >= {info.ge}" if info.ge is not None else "")
    return ""


# ---------------------------------------------------------------------------- manifest


def load_manifest(path: str | Path) -> Manifest:
    """Load and check a dataset manifest; dataset and tokenizer paths come back absolute.
    Errors name the file, the line and the key."""
    try:
        return _load_manifest(path)
    except ConfigError as exc:
        raise with_line(exc, Path(path)) from None


def _load_manifest(path: str | Path) -> Manifest:
    source = str(path)
    raw = load_yaml_params(path, _ManifestFile, source=source)
    base = Path(path).resolve().parent
    _check_profile(raw.model_profile, source)
    _check_sampling(raw.sampling, "sampling", source)
    _check_names(raw.datasets, source)
    top = msgspec.structs.replace(
        raw, tokenizer=_resolve_dir(raw.tokenizer, base, "tokenizer", source),
        dedup=_dedup_mode(raw.dedup, "dedup", source),
    )
    lines = _file_key_lines(Path(path))
    datasets = [
        _resolve_dataset(ds, _origin(source, i, lines), top, base)
        for i, ds in enumerate(top.datasets)
    ]
    _check_dedup_threshold(top, datasets, source)
    return Manifest(
        source=source,
        model_profile=top.model_profile,
        sampling=top.sampling,
        datasets=datasets,
        tokenizer=top.tokenizer,
        concurrency=top.concurrency,
        dedup_threshold=top.dedup_threshold or DEDUP_THRESHOLD,
    )


def _check_profile(name: str, source: str) -> None:
    try:
        get_profile(name)
    except ConfigError as exc:
        message = str(exc).removeprefix(f"{exc.key}: ")
        raise ConfigError("model_profile", message, source) from None


def _check_sampling(sampling: Sampling | SamplingOverride, key: str, source: str) -> None:
    top_k = sampling.top_k
    if top_k is not None and top_k != -1 and top_k < 1:
        raise ConfigError(f"{key}.top_k", f"expected -1 (off) or an int >= 1, got {top_k}", source)


def _dedup_mode(value: _DedupSetting | None, key: str, source: str) -> DedupMode | None:
    """A dedup setting as a mode: YAML's false (a bare `off` or `no`) is "off"; true (a bare
    `on` or `yes`) is no mode, a ConfigError naming the key. None stays None (inherit)."""
    if isinstance(value, bool):
        if value:
            raise ConfigError(key, "invalid value true (expected one of: exact, near, off; YAML "
                              "reads a bare on or yes as true)", source)
        return "off"
    return value


def _check_dedup_threshold(top: _ManifestFile, datasets: list[DatasetSpec], source: str) -> None:
    """ConfigError for a dedup_threshold that no dataset uses (none has dedup: near)."""
    if top.dedup_threshold is not None and all(ds.dedup != "near" for ds in datasets):
        raise ConfigError("dedup_threshold", "only applies with dedup: near (at the top level "
                          "or on a dataset)", source)


def _file_key_lines(path: Path) -> dict[str, int]:
    """The YAML line of every key path of the manifest file ({} when it cannot be read)."""
    try:
        return key_lines(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return {}


def _origin(source: str, index: int, lines: dict[str, int]) -> DatasetOrigin:
    """Where dataset `index` is written in the manifest, from the file's key lines."""
    prefix = f"datasets[{index}]."
    keys = {k.removeprefix(prefix): v for k, v in lines.items()
            if k.startswith(prefix) and "." not in k.removeprefix(prefix)}
    return DatasetOrigin(source, index, lines.get(f"datasets[{index}]"), keys)


def _check_names(datasets: list[_DatasetEntry], source: str) -> None:
    if not datasets:
        raise ConfigError("datasets", "at least one dataset is needed", source)
    first_index: dict[str, int] = {}
    for i, ds in enumerate(datasets):
        if not DATASET_NAME_PATTERN.fullmatch(ds.name):
            raise ConfigError(
                f"datasets[{i}].name",
                f"{ds.name!r} is not a safe directory name (letters, digits, '.', '_' and '-', "
                "starting with a letter or digit, at most 128 characters)",
                source,
            )
        if ds.name in first_index:
            raise ConfigError(
                f"datasets[{i}].name",
                f"duplicate name {ds.name!r} (also datasets[{first_index[ds.name]}])",
                source,
            )
        first_index[ds.name] = i


def _resolve_dataset(
    ds: _DatasetEntry, origin: DatasetOrigin, top: _ManifestFile, base: Path
) -> DatasetSpec:
    """The dataset with absolute paths, the top level's defaults and its origin, after the
    checks that need the manifest around it (`top.tokenizer` is already resolved)."""
    key, source = f"datasets[{origin.index}]", origin.source
    if ds.sampling is not None:
        _check_sampling(ds.sampling, f"{key}.sampling", source)
    if ds.chat_template_kwargs and ds.input not in CHAT_INPUTS:
        raise ConfigError(f"{key}.chat_template_kwargs",
                          "only applies to input 'messages' or 'conversations'", source)
    if ds.render == "server" and ds.input not in CHAT_INPUTS:
        raise ConfigError(f"{key}.render", "server only applies to input 'messages' or "
                          "'conversations'", source)
    if ds.truncated != "end" and ds.turns != "each" and top.turns != "each":
        raise ConfigError(f"{key}.truncated", "only applies with turns: each", source)
    if ds.turns == "each" and ds.input not in CHAT_INPUTS:
        raise ConfigError(f"{key}.turns", "each only applies to input 'messages' or "
                          "'conversations'", source)
    if ds.context_fit_min_tokens is not None and ds.context_fit != "reduce_generation":
        raise ConfigError(f"{key}.context_fit_min_tokens",
                          "only applies with context_fit: reduce_generation", source)
    ds_tokenizer = _resolve_dir(ds.tokenizer, base, f"{key}.tokenizer", source) or top.tokenizer
    if ds.input in CHAT_INPUTS and ds_tokenizer is None:
        raise ConfigError(
            f"{key}.tokenizer",
            f"input {ds.input!r} needs a tokenizer (set it here or at the top level)",
            source,
        )
    modes, modes_source = _resolve_modes(ds, top, base, key, source)
    data_path = _resolve(ds.path, base)
    if not data_path.is_file():
        reason = "not a regular file" if data_path.exists() else "file not found"
        raise ConfigError(f"{key}.path", f"{reason}: {data_path}", source)
    resolved = {
        "path": str(data_path),
        "tokenizer": ds_tokenizer,
        "trust_remote_code": ds.trust_remote_code or top.trust_remote_code,
        "order": ds.order or top.order,
        "dedup": _dedup_mode(ds.dedup, f"{key}.dedup", source) or top.dedup,
        "turns": ds.turns or (top.turns if ds.input in CHAT_INPUTS else "last"),
        "modes": modes or None,
        "modes_source": modes_source,
    }
    return DatasetSpec(**{**msgspec.structs.asdict(ds), **resolved}, origin=origin)


def _resolve_modes(ds: _DatasetEntry, top: _ManifestFile, base: Path, key: str,
                   source: str) -> tuple[list[Mode], str | None]:
    """The dataset's modes (its own, else the manifest's for a chat input; a deployment
    sample read into modes) and the sample's absolute path; ConfigError naming the key."""
    setting, where = ds.modes, f"{key}.modes"
    if setting is None and ds.input in CHAT_INPUTS:
        setting, where = top.modes, "modes"
    if setting is None:
        return [], None
    sample: str | None = None
    if isinstance(setting, ModesFrom):
        path = _resolve(setting.from_, base)
        if not path.is_file():
            raise ConfigError(f"{where}.from", f"file not found: {path}", source)
        sample = str(path)
        setting = [Mode(m.name, float(m.count), m.chat_template_kwargs)
                   for m in deployment_mix(path, str(path))]
    _check_modes(setting, ds.input, where, source)
    return setting, sample


def _check_modes(modes: list[Mode], input_mode: str, key: str, source: str) -> None:
    if not modes:
        raise ConfigError(key, "expected at least one mode (or leave modes out)", source)
    seen: dict[str, int] = {}
    for i, mode in enumerate(modes):
        if not MODE_NAME_PATTERN.fullmatch(mode.name):
            raise ConfigError(f"{key}[{i}].name", f"{mode.name!r} is not a mode name (letters, "
                              "digits and '.', '_', '-', '=', ',', at most 64 characters)",
                              source)
        if mode.name in seen:
            raise ConfigError(f"{key}[{i}].name",
                              f"duplicate name {mode.name!r} (also {key}[{seen[mode.name]}])",
                              source)
        seen[mode.name] = i
        if mode.chat_template_kwargs and input_mode not in CHAT_INPUTS:
            raise ConfigError(f"{key}[{i}].chat_template_kwargs",
                              "only applies to input 'messages' or 'conversations'", source)
        if mode.sampling is not None:
            _check_sampling(mode.sampling, f"{key}[{i}].sampling", source)


def _resolve(path: str, base: Path) -> Path:
    """`path` with `~` expanded, relative to `base` unless absolute."""
    return (base / Path(path).expanduser()).resolve()


def _resolve_dir(path: str | None, base: Path, key: str, source: str) -> str | None:
    if path is None:
        return None
    resolved = _resolve(path, base)
    if not resolved.is_dir():
        raise ConfigError(key, f"directory not found: {resolved}", source)
    return str(resolved)

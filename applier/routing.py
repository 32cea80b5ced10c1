"""Table routing: which upstream tables are replicated, and under which target names.

Rules come from the ``[[route]]`` blocks of the configuration (see :mod:`applier.config`) and are
evaluated per event, right after decoding and before the resolved-ts gate.

Matching follows TiDB's table filter (https://docs.pingcap.com/tidb/stable/table-filter), the syntax
TiCDC, DM, Lightning and BR use:

* a rule's ``match`` is ``schema.table``; each half is one of

  - a wildcard pattern: ``*`` matches any sequence (also empty), ``?`` one character, ``[a-z]`` one
    character of a class, ``[!a-z]`` one character outside it; letters, digits, ``$``, ``_`` and
    non-ASCII characters stand for themselves; any other ASCII punctuation must be escaped with ``\\``
    (``\\.`` is a literal dot, ``\\*`` a literal star); escaping a letter or digit is an error
    (reserved by TiDB);
  - a quoted name: ``"any name.with dots"`` (``""`` for a quote) or ```any name``` (two backquotes
    for one); quoted names are literal, wildcards inside them are plain characters;
  - a regular expression between slashes: ``/^sbtest_\\d+$/``, searched (not anchored) in the name;
* a leading ``!`` makes the rule exclude what it matches (the same as ``ignore = true``);
* names are compared case-insensitively, as TiDB does with its default ``case-sensitive = false``;
* the **last** matching rule decides. Unlike a TiDB filter, a table that no rule matches is not
  dropped: it is replicated under its own name (or into ``target.schema`` when that is set), so a
  configuration without rules replicates everything.

Differences from TiDB kept on purpose: ``#`` comments and ``@file`` imports are not accepted in a
``match`` (write one ``[[route]]`` per rule), and ``/regex/`` uses Python's ``re`` syntax (a superset of
Go's RE2 for practical purposes, but lookarounds that TiDB would reject are accepted here).

System schemas (:data:`SYSTEM_SCHEMAS`) are always ignored, whatever the rules say.

Schema-level DDL (``CREATE DATABASE``, ``DROP DATABASE``, ...) is routed with ``table == ""`` and
follows TiDB's ``MatchSchema`` semantics: a rule takes part when its schema half matches, so ``shop.*``
and ``shop.orders`` both apply to schema ``shop``; an ignore rule only drops the schema-level DDL when
its table half is exactly ``*`` (``!shop.*`` ignores schema ``shop``, ``!shop.secret`` only one table
and leaves the schema replicated). A rename rule's ``schema`` template is applied with
``{table}`` = ""; when the template uses ``{table}`` the upstream schema is spread over several target
schemas, there is no single target for the schema-level DDL, and it is ignored (returns ``None``).

Note for DDL writers: when several upstream schemas land in one target schema (``target.schema`` set,
or a constant ``schema`` template), a ``DROP DATABASE`` of one of them routes to the shared target
schema; dropping that would destroy the others' tables.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from typing import Callable, Sequence

__all__ = [
    "MAX_NAME_LENGTH",
    "SYSTEM_SCHEMAS",
    "Router",
    "RoutingError",
    "Rule",
    "RuleError",
    "is_system_schema",
]

#: Upstream schemas that are never replicated (compared case-insensitively).
SYSTEM_SCHEMAS: frozenset[str] = frozenset(
    {
        "mysql",
        "information_schema",
        "performance_schema",
        "metrics_schema",
        "inspection_schema",
        "sys",
        "lightning_task_info",
        "tidb_cdc",
    }
)

#: Longest schema or table name a template may produce (MySQL's identifier limit; PostgreSQL's is
#: 63 bytes and is the PostgreSQL writer's business).
MAX_NAME_LENGTH = 64

#: what :meth:`Router.route` is to its callers: upstream (schema, table) -> target (schema, table), None to drop
Route = Callable[[str, str], "tuple[str, str] | None"]

_TEMPLATE_FIELDS = ("schema", "table")


def is_system_schema(schema: str) -> bool:
    """True for a schema the applier never replicates (see :data:`SYSTEM_SCHEMAS`)."""
    return schema.lower() in SYSTEM_SCHEMAS


class RuleError(ValueError):
    """A ``[[route]]`` rule that cannot be compiled.

    ``field`` names the rule's key at fault (``match``, ``schema``, ``table`` or ``ignore``);
    :mod:`applier.config` turns it into a :class:`~applier.config.ConfigError` keyed ``route[i].<field>``.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class RoutingError(Exception):
    """A rename template produced an unusable name (empty, or longer than 64 characters) for a table."""

    def __init__(self, rule: "Rule", schema: str, table: str, message: str) -> None:
        where = f"{schema}.{table}" if table else f"schema {schema}"
        super().__init__(f"{rule.label} (match = {rule.match!r}) on {where}: {message}")
        self.rule = rule
        self.schema = schema
        self.table = table
        self.message = message


# --------------------------------------------------------------------------------------------------
# Pattern compilation (TiDB table-filter syntax -> Python regex)
# --------------------------------------------------------------------------------------------------

_REGEXP_PART = re.compile(r"/(?:\\.|[^/])+/", re.S)
_DOUBLE_QUOTED_PART = re.compile(r'"(?:""|[^"])+"', re.S)
_BACKQUOTED_PART = re.compile(r"`(?:``|[^`])+`", re.S)
_CHAR_CLASS = re.compile(r"\[!?(?:\\[^0-9a-zA-Z]|[^\\\]])+\]", re.S)
_FLAGS = re.IGNORECASE | re.DOTALL


@dataclass(frozen=True)
class _Matcher:
    """One half (schema or table) of a compiled pattern."""

    regex: re.Pattern[str] | None  # None: matches everything (the bare ``*``)

    @property
    def matches_all(self) -> bool:
        return self.regex is None

    def match(self, name: str) -> bool:
        return self.regex is None or self.regex.search(name) is not None


_MATCH_ALL = _Matcher(None)


def _is_ascii_alnum(c: str) -> bool:
    return c.isascii() and c.isalnum()


def _compile(regex: str) -> _Matcher:
    try:
        return _Matcher(re.compile(regex, _FLAGS))
    except re.error as exc:
        raise RuleError("match", f"invalid pattern: {exc}") from None


def _parse_part(text: str, pos: int, half: str) -> tuple[_Matcher, int]:
    """Parse one half of a pattern starting at ``pos``; return the matcher and the position after it."""
    if pos >= len(text):
        raise RuleError("match", f"syntax error: missing {half} pattern")
    c = text[pos]
    if c == "/":
        m = _REGEXP_PART.match(text, pos)
        if m is None:
            raise RuleError("match", "syntax error: incomplete regexp (close it with /)")
        return _compile(m.group()[1:-1]), m.end()
    if c in "\"`":
        m = (_DOUBLE_QUOTED_PART if c == '"' else _BACKQUOTED_PART).match(text, pos)
        if m is None:
            raise RuleError("match", f"syntax error: incomplete quoted identifier (close it with {c})")
        name = m.group()[1:-1].replace(c + c, c)
        return _compile("^" + re.escape(name) + r"\Z"), m.end()
    return _parse_wildcard(text, pos)


def _parse_wildcard(text: str, pos: int) -> tuple[_Matcher, int]:
    out: list[str] = []
    i = pos
    while i < len(text):
        c = text[i]
        if c == "\\":
            if i == len(text) - 1:
                raise RuleError("match", "syntax error: cannot place \\ at the end of a pattern")
            esc = text[i + 1]
            if _is_ascii_alnum(esc):
                raise RuleError(
                    "match",
                    f"cannot escape a letter or number (\\{esc}); it is reserved by TiDB's table filter",
                )
            out.append(re.escape(esc))
            i += 2
        elif c == ".":
            break  # the schema/table separator (or stray text after the table half)
        elif c == "*":
            out.append(".*")
            i += 1
        elif c == "?":
            out.append(".")
            i += 1
        elif c == "[":
            m = _CHAR_CLASS.match(text, i)
            if m is None:
                raise RuleError(
                    "match", "syntax error: failed to parse character class (write [a-z] or [!a-z])"
                )
            out.append(_translate_class(m.group()))
            i = m.end()
        elif c in "$_" or _is_ascii_alnum(c) or ord(c) >= 0x80:
            out.append(re.escape(c))
            i += 1
        else:
            raise RuleError(
                "match",
                f"unexpected special character {c!r}; escape it with \\ or quote the name with `...`",
            )
    if i == pos:
        raise RuleError("match", "syntax error: missing pattern")
    regex = "".join(out)
    if regex == ".*":
        return _MATCH_ALL, i
    return _compile("^" + regex + r"\Z"), i


def _translate_class(cls: str) -> str:
    """``[!a-z\\]]`` -> ``[^a-z\\]]``, escaping every member so Python sees no nested-set syntax."""
    body = cls[1:-1]
    negate = body.startswith("!")
    if negate:
        body = body[1:]
    out = ["[^" if negate else "["]
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            out.append(re.escape(body[i + 1]))
            i += 2
            continue
        out.append("-" if c == "-" else re.escape(c))
        i += 1
    out.append("]")
    if negate and not body:
        # ``[!]``: TiDB fails to compile this too.
        raise RuleError("match", "invalid pattern: empty negated character class [!]")
    return "".join(out)


def _parse_match(match: str) -> tuple[bool, _Matcher, _Matcher]:
    """Parse a TiDB table-filter rule: returns (excluded, schema matcher, table matcher)."""
    if not isinstance(match, str):
        raise RuleError("match", f"expected a string like \"shop.*\", got {type(match).__name__}")
    text = match.strip(" \t")
    if not text:
        raise RuleError("match", 'empty pattern; write "schema.table", e.g. "shop.*" or "*.orders"')
    excluded = False
    if text[0] == "#":
        raise RuleError("match", "a comment is not a pattern; remove this [[route]] or write \"schema.table\"")
    if text[0] == "@":
        raise RuleError("match", "filter-file imports (@file) are not supported; write one [[route]] per rule")
    if text[0] == "!":
        excluded = True
        text = text[1:]
    schema_m, pos = _parse_part(text, 0, "schema")
    if pos >= len(text):
        raise RuleError(
            "match", 'wrong table pattern: expected "schema.table" (use "schema.*" for a whole schema)'
        )
    if text[pos] != ".":
        raise RuleError("match", "syntax error: missing '.' between schema and table patterns")
    table_m, pos = _parse_part(text, pos + 1, "table")
    if pos != len(text):
        raise RuleError(
            "match",
            "syntax error: stray characters after table pattern (quote names that contain dots: "
            '`my.table` or "my.table")',
        )
    return excluded, schema_m, table_m


# --------------------------------------------------------------------------------------------------
# Templates
# --------------------------------------------------------------------------------------------------


def _check_template(key: str, template: str) -> frozenset[str]:
    """Validate a ``{schema}``/``{table}`` template; return the placeholders it uses."""
    if not isinstance(template, str):
        raise RuleError(key, f'expected a string template like "{{{key}}}_copy", got {type(template).__name__}')
    used: set[str] = set()
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise RuleError(key, f"malformed template ({exc}); write {{{{ and }}}} for literal braces") from None
    for _literal, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in _TEMPLATE_FIELDS:
            raise RuleError(key, f"unknown placeholder {{{name}}}; use {{schema}} or {{table}}")
        if spec or conversion:
            raise RuleError(key, f"placeholder {{{name}}} takes no format spec or conversion")
        used.add(name)
    if not used:
        literal = template.replace("{{", "{").replace("}}", "}")
        if not literal:
            raise RuleError(key, "must not be empty; leave the key out to keep the upstream name")
        if len(literal) > MAX_NAME_LENGTH:
            raise RuleError(key, f"name longer than {MAX_NAME_LENGTH} characters")
    return frozenset(used)


# --------------------------------------------------------------------------------------------------
# Rules and the router
# --------------------------------------------------------------------------------------------------

#: what happens to a row change the target refuses (applier.apply, applier.quarantine)
APPLY_ERROR_POLICIES = ("stop", "quarantine", "skip")
#: what happens to a message that cannot be decoded (applier.processor): the same three choices
DECODE_ERROR_POLICIES = APPLY_ERROR_POLICIES
#: how a route writes its tables (applier.modes): replica (the default), history (every version), soft_delete
WRITE_MODES = ("replica", "history", "soft_delete")


@dataclass(frozen=True)
class Rule:
    """One compiled ``[[route]]`` rule.

    ``match`` is the TiDB table-filter pattern as written (a leading ``!`` sets ``ignore``).
    ``schema``/``table`` are optional rename templates with ``{schema}`` and ``{table}``; ``None``
    keeps the upstream name (``target.schema`` only applies to tables that no rule matches, so a
    rule that renames only the table keeps the upstream schema name). ``name`` labels the rule in
    error messages (``route[2]``). ``on_apply_error`` overrides ``[target] on_apply_error`` for the tables
    this rule decides, and ``on_decode_error`` overrides ``[pipeline] on_decode_error`` for their messages that
    cannot be decoded (when the table can still be read from the message). ``mode`` is how the tables it decides
    are written (:data:`WRITE_MODES`, see :mod:`applier.modes`; None: replica). Construction compiles the pattern once and raises :class:`RuleError` when the rule is
    invalid.
    """

    match: str
    schema: str | None = None
    table: str | None = None
    ignore: bool = False
    name: str = ""
    on_apply_error: str | None = None
    on_decode_error: str | None = None
    mode: str | None = None
    _schema_m: _Matcher = field(init=False, repr=False, compare=False)
    _table_m: _Matcher = field(init=False, repr=False, compare=False)
    _schema_fields: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        excluded, schema_m, table_m = _parse_match(self.match)
        if not isinstance(self.ignore, bool):
            raise RuleError("ignore", f"expected true or false, got {type(self.ignore).__name__}")
        ignore = self.ignore or excluded
        schema_fields: frozenset[str] = frozenset()
        if self.schema is not None:
            schema_fields = _check_template("schema", self.schema)
        if self.table is not None:
            _check_template("table", self.table)
        if self.on_apply_error is not None and self.on_apply_error not in APPLY_ERROR_POLICIES:
            raise RuleError("on_apply_error", f"must be one of {', '.join(APPLY_ERROR_POLICIES)}, "
                                              f"got {self.on_apply_error!r}")
        if self.on_decode_error is not None and self.on_decode_error not in DECODE_ERROR_POLICIES:
            raise RuleError("on_decode_error", f"must be one of {', '.join(DECODE_ERROR_POLICIES)}, "
                                               f"got {self.on_decode_error!r}")
        if self.mode is not None and self.mode not in WRITE_MODES:
            raise RuleError("mode", f"must be one of {', '.join(WRITE_MODES)}, got {self.mode!r}")
        for policy in ("on_apply_error", "on_decode_error", "mode"):
            if ignore and getattr(self, policy) is not None:
                raise RuleError(policy, f"this rule ignores what it matches, so nothing of it is applied; "
                                        f"drop {policy}")
        if ignore and (self.schema is not None or self.table is not None):
            key = "schema" if self.schema is not None else "table"
            why = "its match starts with '!'" if excluded else "it has ignore = true"
            raise RuleError(key, f"this rule ignores what it matches ({why}), so it cannot rename; drop {key}")
        object.__setattr__(self, "ignore", ignore)
        object.__setattr__(self, "_schema_m", schema_m)
        object.__setattr__(self, "_table_m", table_m)
        object.__setattr__(self, "_schema_fields", schema_fields)

    @property
    def label(self) -> str:
        return self.name or "route"

    def matches(self, schema: str, table: str) -> bool:
        """Does this rule's pattern match the table ``schema.table``?"""
        return self._schema_m.match(schema) and self._table_m.match(table)

    def matches_schema(self, schema: str) -> bool:
        """Does this rule decide a schema-level DDL on ``schema`` (TiDB's MatchSchema)?"""
        return self._schema_m.match(schema) and (not self.ignore or self._table_m.matches_all)

    def _render(self, key: str, template: str, schema: str, table: str) -> str:
        out = template.format(schema=schema, table=table)
        if not out:
            raise RoutingError(self, schema, table, f"the {key} template {template!r} produced an empty name")
        if len(out) > MAX_NAME_LENGTH:
            raise RoutingError(
                self,
                schema,
                table,
                f"the {key} template {template!r} produced a name longer than {MAX_NAME_LENGTH} "
                f"characters: {out!r}",
            )
        return out

    def apply(self, schema: str, table: str) -> tuple[str, str] | None:
        """The target (schema, table) for a matched table, or ``None`` for an ignore rule."""
        if self.ignore:
            return None
        if table == "":
            if "table" in self._schema_fields:
                return None
            target_table = ""
        elif self.table is None:
            target_table = table
        else:
            target_table = self._render("table", self.table, schema, table)
        if self.schema is None:
            target_schema = schema
        else:
            target_schema = self._render("schema", self.schema, schema, table)
        return target_schema, target_table


class Router:
    """Routes upstream (schema, table) names to target names, or drops them.

    Results are cached per (schema, table): :meth:`route` runs for every event. The cache holds at
    most :attr:`MAX_CACHE_ENTRIES` entries and starts over when full. Errors are not cached.
    """

    MAX_CACHE_ENTRIES = 100_000

    def __init__(self, rules: Sequence[Rule], default_schema: str = "") -> None:
        rules = tuple(rules)
        for r in rules:
            if not isinstance(r, Rule):
                raise TypeError(f"Router takes Rule objects, got {type(r).__name__}")
        if not isinstance(default_schema, str):
            raise TypeError("default_schema must be a str")
        self._rules = rules
        self._default_schema = default_schema
        self._cache: dict[tuple[str, str], tuple[str, str] | None] = {}

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self._rules

    @property
    def default_schema(self) -> str:
        return self._default_schema

    @property
    def cache_size(self) -> int:
        return len(self._cache)

    def route(self, schema: str, table: str) -> tuple[str, str] | None:
        """Target ``(schema, table)`` for an upstream table, or ``None`` when it is ignored.

        ``table == ""`` routes a schema-level DDL (``CREATE/DROP DATABASE``): a rule ``shop.*``
        matches schema ``shop``; an ignore rule drops the schema only when its table half is ``*``;
        the result is ``(target_schema, "")``. Raises :class:`RoutingError` when a template produces
        an empty or over-long name.
        """
        key = (schema, table)
        try:
            return self._cache[key]
        except KeyError:
            pass
        result = self._route(schema, table)
        if len(self._cache) >= self.MAX_CACHE_ENTRIES:
            self._cache.clear()
        self._cache[key] = result
        return result

    def is_ignored(self, schema: str, table: str) -> bool:
        return self.route(schema, table) is None

    def routed_by_rule(self, schema: str, table: str) -> bool:
        """Whether a rule that keeps the name decides it, as opposed to the default that keeps every name no
        rule matches: a DDL may reach beyond its own schema only into names the operator routed on purpose.
        ``table == ""`` asks about the schema, as :meth:`route` does."""
        if is_system_schema(schema):
            return False
        for rule in reversed(self._rules):
            if rule.matches_schema(schema) if table == "" else rule.matches(schema, table):
                return self._route(schema, table) is not None
        return False

    def apply_error_policy(self, schema: str, table: str) -> str | None:
        """The ``on_apply_error`` of the rule that decides this table, or None (then ``[target]``'s applies)."""
        for rule in reversed(self._rules):
            if rule.matches(schema, table):
                return rule.on_apply_error
        return None

    def write_mode(self, schema: str, table: str) -> str:
        """How the tables of ``schema.table`` are written: the ``mode`` of the rule that decides it, "replica" when
        it sets none or no rule matches (applier.modes). For a schema (``table == ""``, a schema-level DDL): the
        mode of the last rule that sets one other than "replica" and takes part for the schema (TiDB's
        MatchSchema), since such a DDL reaches every table of the schema; else "replica"."""
        if table == "":
            for rule in reversed(self._rules):
                if rule.mode not in (None, "replica") and not rule.ignore and rule.matches_schema(schema):
                    return rule.mode
            return "replica"
        for rule in reversed(self._rules):
            if rule.matches(schema, table):
                return rule.mode or "replica"
        return "replica"

    def decode_error_policy(self, schema: str, table: str) -> str | None:
        """The ``on_decode_error`` of the rule that decides this table, or None (then ``[pipeline]``'s applies)."""
        for rule in reversed(self._rules):
            if rule.matches(schema, table):
                return rule.on_decode_error
        return None

    def _route(self, schema: str, table: str) -> tuple[str, str] | None:
        if is_system_schema(schema):
            return None
        if table == "":
            for rule in reversed(self._rules):
                if rule.matches_schema(schema):
                    return rule.apply(schema, "")
            return self._default_schema or schema, ""
        for rule in reversed(self._rules):
            if rule.matches(schema, table):
                return rule.apply(schema, table)
        return self._default_schema or schema, table

    def __repr__(self) -> str:
        return f"Router(rules={list(self._rules)!r}, default_schema={self._default_schema!r})"

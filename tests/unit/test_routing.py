"""Routing: TiDB table-filter matching, last-match-wins, renames, system schemas, caching."""

from __future__ import annotations

import pytest

from applier.routing import (
    MAX_NAME_LENGTH,
    SYSTEM_SCHEMAS,
    Router,
    RoutingError,
    Rule,
    RuleError,
    is_system_schema,
)


def accepts(patterns: list[str], schema: str, table: str) -> bool:
    """TiDB filter semantics on top of the router: a leading "!*.*" makes unmatched tables excluded,
    so routing a table to something means the filter accepts it."""
    rules = [Rule("!*.*")] + [Rule(p) for p in patterns]
    return Router(rules).route(schema, table) is not None


# --------------------------------------------------------------------------------------------------
# Table-filter syntax: the cases of TiDB's table_filter_test.go (case-insensitive column) and docs
# --------------------------------------------------------------------------------------------------

TIDB_CASES = [
    (["*.*"], [("foo", "bar", True)]),
    (["foo.*"], [("foo", "bar", True), ("foo1", "bar", False), ("foo2", "bar", False)]),
    (["*.*", "!foo1.*"], [("foo", "bar", True), ("foo1", "bar", False), ("foo2", "bar", True)]),
    (["foo.bar1"], [("foo", "bar", False), ("foo", "bar1", True), ("fff", "bar1", False)]),
    (["*.*", "!foo.bar"], [("foo", "bar", False), ("foo", "bar1", True), ("fff", "bar1", True)]),
    (
        ["/^foo/.*", r"!/^foo/./^sbtest-\d/"],
        [("foo", "sbtest", True), ("foo1", "sbtest-1", False), ("fff", "bar", False)],
    ),
    (
        ["*.*", "!foo[bar].*", "!bar?.*", r"!special\\.*"],
        [
            ("foor", "a", False),
            ("foo[bar]", "b", True),
            ("ba", "c", True),
            ("bar?", "d", False),
            ("special\\", "e", False),
            ("special\\\\", "f", True),
            ("bazzz", "g", True),
            ("special\\$", "h", True),
            ("afooa", "i", True),
        ],
    ),
    (
        ["*.*", "!/^FOO/.*", "!*./FoO$/"],
        [("FOO1", "a", False), ("foo2", "b", False), ("BoO3", "cFoO", False), ("Foo4", "dfoo", False), ("5", "5", True)],
    ),
    (
        ["*.*", "!a?b?./f[0-9]/"],
        [("abbd", "f1", False), ("aaaa", "f2", True), ("5", "5", True), ("abbc", "fa", True)],
    ),
    (
        ["*.*", "!/t[0-8]/.a??"],
        [("t1", "a01", False), ("t9", "a02", True), ("5", "5", True), ("t8", "a001", True)],
    ),
    (["*.*", "!a*.A*"], [("aB", "Ab", False), ("AaB", "aab", False), ("acB", "Afb", False)]),
    (["BAR.*"], [("bar", "a", True), ("BAR", "a", True)]),
    (
        ["p_123$.45", "中文.表名"],
        [("p_123", "45", False), ("p_123$", "45", True), ("英文", "表名", False), ("中文", "表名", True)],
    ),
    ([r"\\\..*"], [("\\.", "a", True), ("\\\\\\.", "b", False), ("\\a", "c", False)]),
    (
        ["[!a-z].[^a-z]"],
        [
            ("!", "z", True),
            ("!", "^", True),
            ("!", "9", False),
            ("a", "z", False),
            ("a", "^", False),
            ("a", "9", False),
            ("1", "z", True),
            ("1", "^", True),
            ("1", "9", False),
        ],
    ),
    (
        ['"some ""quoted""".`identifiers?`'],
        [
            ('some "quoted"', "identifiers?", True),
            ('some "quoted"', "identifiers!", False),
            ('some ""quoted""', "identifiers?", False),
            ('SOME "QUOTED"', "IDENTIFIERS?", True),
            ('some\t"quoted"', "identifiers?", False),
        ],
    ),
    (
        ["db*.*", "!*.cfg*", "*.cfgsample"],
        [
            ("irrelevant", "table", False),
            ("db1", "tbl1", True),
            ("db1", "cfg1", False),
            ("db1", "cfgsample", True),
            ("else", "cfgsample", True),
        ],
    ),
    (["*.*", "!S.D[!a-d]"], [("S", "D1", False), ("S", "Da", True), ("S", "Db", True), ("S", "Daa", True)]),
    (["*.*", "!S.D[a-d]"], [("S", "D1", True), ("S", "Da", False), ("S", "Db", False), ("S", "Daa", True)]),
]


@pytest.mark.parametrize(
    "patterns,schema,table,expected",
    [(p, s, t, e) for p, cases in TIDB_CASES for (s, t, e) in cases],
)
def test_tidb_table_filter_cases(patterns, schema, table, expected):
    assert accepts(patterns, schema, table) is expected


DOCS_CASES = [
    # https://docs.pingcap.com/tidb/stable/table-filter examples
    ("employees.*", "employees", "salaries", True),
    ("employees.*", "employees_x", "salaries", False),
    ("*.WorkOrder", "production", "workorder", True),
    ("*.WorkOrder", "production", "workorders", False),
    ("db?.t?", "db1", "t2", True),
    ("db?.t?", "db12", "t2", False),
    ("db[0-9].tbl[0-9a-f][0-9a-f]", "db3", "tbl4f", True),
    ("db[0-9].tbl[0-9a-f][0-9a-f]", "db3", "tbl4g", False),
    ("db[!0-9].*", "dbx", "t", True),
    ("db[!0-9].*", "db1", "t", False),
    ("db\\*.t", "db*", "t", True),  # escaped wildcard is literal
    ("db\\*.t", "dbx", "t", False),
    ("`db.with.dots`.t", "db.with.dots", "t", True),
    ('"db.with.dots".t', "db.with.dots", "t", True),
    ("`db*`.t", "db*", "t", True),  # quoted wildcard is literal
    ("`db*`.t", "dbx", "t", False),
    ("`a``b`.t", "a`b", "t", True),
    ("db\\.x.t", "db.x", "t", True),  # escaped dot inside a wildcard name
    ("/^db_\\d+$/.t", "db_12", "t", True),
    ("/^db_\\d+$/.t", "db_x", "t", False),
    ("/db/.t", "xdby", "t", True),  # regexes search, like Go's MatchString
    ("/a\\/b/.t", "a/b", "t", True),  # escaped slash inside a regex
    ("*.*", "", "", True),
    ("  shop.*\t", "shop", "a", True),  # surrounding blanks are trimmed
    ("Shop.Orders", "SHOP", "orders", True),
    ("ärger.*", "ÄRGER", "t", True),  # non-ASCII letters are plain characters, compared case-insensitively
]


@pytest.mark.parametrize("pattern,schema,table,expected", DOCS_CASES)
def test_docs_table_filter_cases(pattern, schema, table, expected):
    assert Rule(pattern).matches(schema, table) is expected


def test_star_does_not_need_to_match_dot_separator_but_matches_dots_in_names():
    rule = Rule("a*.t")
    assert rule.matches("a.b.c", "t")  # names may contain dots; * matches them
    assert not rule.matches("b.a", "t")


INVALID_PATTERNS = [
    ("", "empty pattern"),
    ("   ", "empty pattern"),
    ("db", "wrong table pattern"),
    ("db.", "missing table pattern"),
    (".t", "missing pattern"),
    ("a.b.c", "stray characters"),
    ("a%b.c", "unexpected special character '%'"),
    ("a b.c", "unexpected special character ' '"),
    ("db.tbl#not comment", "unexpected special character '#'"),
    (r"a\tb.c", "cannot escape a letter or number"),
    ("db\\", "cannot place \\"),
    ("[].*", "failed to parse character class"),
    ("[.*", "failed to parse character class"),
    (r"[\d\D].*", "failed to parse character class"),
    ("[!].*", "invalid pattern"),
    ("[z-a].*", "invalid pattern"),
    ("`db`*.*", "missing '.'"),
    ("/db.*", "incomplete regexp"),
    ("`db.*", "incomplete quoted identifier"),
    ('"db.*', "incomplete quoted identifier"),
    ('"".t', "incomplete quoted identifier"),
    ("/(/.*", "invalid pattern"),
    ("# comment", "comment"),
    ("@filters.txt", "imports"),
    ("!", "missing schema pattern"),
    ("! db.t", "unexpected special character ' '"),
]


@pytest.mark.parametrize("pattern,fragment", INVALID_PATTERNS)
def test_invalid_patterns(pattern, fragment):
    with pytest.raises(RuleError) as info:
        Rule(pattern)
    assert info.value.field == "match"
    assert fragment in info.value.message


def test_non_string_match_is_rejected():
    with pytest.raises(RuleError) as info:
        Rule(42)  # type: ignore[arg-type]
    assert info.value.field == "match"


def test_char_class_members_are_literal_for_python_re():
    # Python's re would read "[[]" or "&&" as nested-set syntax; the translation escapes members.
    assert Rule("[[]x.t").matches("[x", "t")
    assert Rule("a[&&]b.t").matches("a&b", "t")
    assert Rule(r"a[\]]b.t").matches("a]b", "t")
    assert Rule("a[-x].t").matches("a-", "t")


# --------------------------------------------------------------------------------------------------
# Templates and rule construction
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,field,fragment",
    [
        ({"schema": "{db}"}, "schema", "unknown placeholder {db}"),
        ({"table": "{table!r}"}, "table", "no format spec"),
        ({"table": "{table:>10}"}, "table", "no format spec"),
        ({"schema": "{schema"}, "schema", "malformed template"),
        ({"schema": "x}"}, "schema", "malformed template"),
        ({"schema": ""}, "schema", "must not be empty"),
        ({"table": ""}, "table", "must not be empty"),
        ({"table": "x" * (MAX_NAME_LENGTH + 1)}, "table", "longer than 64"),
        ({"schema": 3}, "schema", "expected a string"),
        ({"ignore": "yes"}, "ignore", "expected true or false"),
        ({"schema": "s", "ignore": True}, "schema", "cannot rename"),
        ({"table": "t", "ignore": True}, "table", "cannot rename"),
    ],
)
def test_invalid_rules(kwargs, field, fragment):
    with pytest.raises(RuleError) as info:
        Rule("shop.*", **kwargs)
    assert info.value.field == field
    assert fragment in info.value.message


def test_bang_rule_cannot_rename():
    with pytest.raises(RuleError) as info:
        Rule("!shop.*", schema="x")
    assert info.value.field == "schema"
    assert "'!'" in info.value.message


def test_bang_sets_ignore():
    assert Rule("!shop.*").ignore is True
    assert Rule("shop.*").ignore is False
    assert Rule("shop.*", ignore=True).ignore is True


def test_literal_braces_in_templates():
    router = Router([Rule("a.b", table="{{{table}}}")])
    assert router.route("a", "b") == ("a", "{b}")


# --------------------------------------------------------------------------------------------------
# Router semantics
# --------------------------------------------------------------------------------------------------


def test_no_rules_keeps_names():
    r = Router([])
    assert r.route("shop", "orders") == ("shop", "orders")
    assert r.route("Shop", "Orders") == ("Shop", "Orders")  # case preserved


def test_default_schema_for_unmatched_tables():
    r = Router([Rule("shop.*", schema="shop_copy")], default_schema="replica")
    assert r.route("crm", "users") == ("replica", "users")
    assert r.route("shop", "orders") == ("shop_copy", "orders")
    assert r.route("crm", "") == ("replica", "")


def test_rename_rule_without_schema_template_keeps_upstream_schema():
    r = Router([Rule("shop.orders", table="orders_v2")], default_schema="replica")
    assert r.route("shop", "orders") == ("shop", "orders_v2")


def test_templates():
    r = Router(
        [
            Rule("shop.*", schema="{schema}_copy"),
            Rule("crm.*", schema="all", table="{schema}__{table}"),
            Rule("log.*", table="{table}_arch"),
        ]
    )
    assert r.route("shop", "orders") == ("shop_copy", "orders")
    assert r.route("crm", "users") == ("all", "crm__users")
    assert r.route("log", "e") == ("log", "e_arch")
    # templates use the upstream spelling, not the lowered one
    assert r.route("SHOP", "Orders") == ("SHOP_copy", "Orders")


def test_last_match_wins():
    rules = [
        Rule("shop.*", schema="a"),
        Rule("shop.order*", schema="b"),
        Rule("!shop.orders_tmp"),
        Rule("*.orders_tmp", schema="c"),
    ]
    r = Router(rules)
    assert r.route("shop", "users") == ("a", "users")
    assert r.route("shop", "orders") == ("b", "orders")
    assert r.route("shop", "orders_tmp") == ("c", "orders_tmp")  # the later rename beats the ignore
    r2 = Router(rules[:3])
    assert r2.route("shop", "orders_tmp") is None
    # reversed order: the broad rule, listed last, wins over everything
    r3 = Router(list(reversed(rules)))
    assert r3.route("shop", "orders_tmp") == ("a", "orders_tmp")


def test_ignore_rules():
    r = Router([Rule("!shop.*"), Rule("shop.keep")])
    assert r.route("shop", "x") is None
    assert r.route("shop", "keep") == ("shop", "keep")
    assert r.route("other", "x") == ("other", "x")
    r2 = Router([Rule("shop.*", ignore=True)])
    assert r2.route("shop", "x") is None
    assert r2.is_ignored("shop", "x")
    assert not r2.is_ignored("crm", "x")


@pytest.mark.parametrize("schema", sorted(SYSTEM_SCHEMAS) + ["MySQL", "INFORMATION_SCHEMA", "Tidb_Cdc"])
def test_system_schemas_always_ignored(schema):
    r = Router([Rule("*.*", schema="copy"), Rule(f"`{schema}`.*", schema="x")])
    assert is_system_schema(schema)
    assert r.route(schema, "t") is None
    assert r.route(schema, "") is None


def test_non_system_schema_lookalikes_are_routed():
    r = Router([])
    for schema in ("mysql2", "my_sql", "sys_data", "tidb_cdc_x"):
        assert r.route(schema, "t") == (schema, "t")


# --------------------------------------------------------------------------------------------------
# Schema-level DDL (table == "")
# --------------------------------------------------------------------------------------------------


def test_schema_level_ddl_follows_schema_rules():
    r = Router([Rule("shop.*", schema="shop_copy")])
    assert r.route("shop", "") == ("shop_copy", "")
    assert r.route("crm", "") == ("crm", "")


def test_schema_level_ddl_with_table_specific_rename_rule():
    r = Router([Rule("shop.orders", schema="archive")])
    assert r.route("shop", "") == ("archive", "")  # TiDB MatchSchema: the schema half decides


def test_schema_level_ddl_ignore_needs_whole_schema():
    assert Router([Rule("!shop.*")]).route("shop", "") is None
    assert Router([Rule("shop.*", ignore=True)]).route("shop", "") is None
    # an ignore rule for some tables leaves the schema replicated; earlier rules still apply
    r = Router([Rule("shop.*", schema="copy"), Rule("!shop.secret")])
    assert r.route("shop", "") == ("copy", "")
    assert r.route("shop", "secret") is None
    # whitelist style: everything excluded, then one table included -> its schema is replicated
    r2 = Router([Rule("!*.*"), Rule("shop.orders")])
    assert r2.route("shop", "") == ("shop", "")
    assert r2.route("crm", "") is None


def test_schema_level_ddl_with_table_in_schema_template_is_ignored():
    r = Router([Rule("shop.*", schema="{schema}_{table}")])
    assert r.route("shop", "") is None
    assert r.route("shop", "orders") == ("shop_orders", "orders")


def test_schema_level_ddl_ignores_table_template():
    r = Router([Rule("shop.*", table="x_{table}")])
    assert r.route("shop", "") == ("shop", "")


# --------------------------------------------------------------------------------------------------
# Routing errors
# --------------------------------------------------------------------------------------------------


def test_template_producing_empty_name_raises_routing_error():
    # table names are never empty for row events, but an upstream schema name fed into a table
    # template can be (a malformed event): the router refuses rather than writing to "".
    r = Router([Rule("*.*", table="{schema}", name="route[1]")])
    with pytest.raises(RoutingError) as info:
        r.route("", "t")
    err = info.value
    assert "route[1]" in str(err) and ".t" in str(err) and "empty" in str(err)
    assert err.rule.name == "route[1]" and err.table == "t"
    assert Router([Rule("*.*", schema="{table}")]).route("shop", "orders") == ("orders", "orders")


def test_template_producing_long_name_raises_routing_error():
    r = Router([Rule("shop.*", table="{schema}_{table}_" + "x" * 40, name="route[0]")])
    assert r.route("shop", "t")[1].startswith("shop_t_")
    long_table = "t" * 30
    with pytest.raises(RoutingError) as info:
        r.route("shop", long_table)
    assert "route[0]" in str(info.value)
    assert long_table in str(info.value)
    assert "longer than 64" in str(info.value)


def test_routing_errors_are_not_cached():
    r = Router([Rule("*.*", table="{schema}", name="route[0]")])
    for _ in range(2):
        with pytest.raises(RoutingError):
            r.route("", "t")
    assert r.cache_size == 0


# --------------------------------------------------------------------------------------------------
# Caching
# --------------------------------------------------------------------------------------------------


def test_cache_returns_same_results_and_is_keyed_by_schema_and_table():
    r = Router([Rule("shop.*", schema="copy"), Rule("!shop.tmp")])
    first = [r.route("shop", "a"), r.route("shop", "tmp"), r.route("crm", "a"), r.route("shop", "")]
    assert r.cache_size == 4
    second = [r.route("shop", "a"), r.route("shop", "tmp"), r.route("crm", "a"), r.route("shop", "")]
    assert first == second == [("copy", "a"), None, ("crm", "a"), ("copy", "")]
    assert r.cache_size == 4
    # case variants are distinct keys (the output keeps the upstream spelling)
    assert r.route("SHOP", "A") == ("copy", "A")
    assert r.cache_size == 5


def test_cache_avoids_recomputing(monkeypatch):
    r = Router([Rule("shop.*", schema="copy")])
    calls = []
    original = r._route

    def counting(schema, table):
        calls.append((schema, table))
        return original(schema, table)

    monkeypatch.setattr(r, "_route", counting)
    for _ in range(100):
        assert r.route("shop", "a") == ("copy", "a")
    assert calls == [("shop", "a")]


def test_cache_is_bounded():
    r = Router([])
    r.MAX_CACHE_ENTRIES = 10
    for i in range(25):
        assert r.route("s", f"t{i}") == ("s", f"t{i}")
    assert r.cache_size <= 10


def test_caches_are_per_router():
    a = Router([Rule("shop.*", schema="a")])
    b = Router([Rule("shop.*", schema="b")])
    assert a.route("shop", "t") == ("a", "t")
    assert b.route("shop", "t") == ("b", "t")


def test_router_rejects_non_rules():
    with pytest.raises(TypeError):
        Router(["shop.*"])  # type: ignore[list-item]


def test_rules_are_hashable_and_comparable():
    assert Rule("shop.*", schema="x") == Rule("shop.*", schema="x")
    assert len({Rule("a.b"), Rule("a.b")}) == 1


# --------------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------------

try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    given = settings = st = None  # type: ignore[assignment]


if given is not None:
    _names = st.text(alphabet="abAB_1", min_size=0, max_size=5)
    _globs = st.text(alphabet="abAB_1*?", min_size=1, max_size=5)

    @settings(max_examples=300, deadline=None)
    @given(pattern=_globs, name=_names)
    def test_wildcards_agree_with_fnmatch(pattern, name):
        import fnmatch

        expected = fnmatch.fnmatchcase(name.lower(), pattern.lower())
        assert Rule(f"{pattern}.t").matches(name, "t") is expected
        assert Rule(f"s.{pattern}").matches("s", name) is expected

    @settings(max_examples=200, deadline=None)
    @given(
        rules=st.lists(
            st.tuples(_globs, _globs, st.booleans(), st.sampled_from([None, "x_{schema}", "{table}_y"])),
            max_size=5,
        ),
        lookups=st.lists(st.tuples(_names.filter(bool), _names), max_size=20),
    )
    def test_cached_results_equal_fresh_results(rules, lookups):
        compiled = [
            Rule(f"{s}.{t}", ignore=ign) if ign else Rule(f"{s}.{t}", schema=tpl) for s, t, ign, tpl in rules
        ]
        cached = Router(compiled)
        for schema, table in lookups + lookups:  # second pass hits the cache
            assert cached.route(schema, table) == Router(compiled).route(schema, table)


def test_routed_by_rule_is_a_deliberate_keep_not_the_default():
    r = Router([Rule(match="shop.*", schema="copy"), Rule(match="shop.secret", ignore=True)])
    assert r.routed_by_rule("shop", "orders") and r.routed_by_rule("shop", "")
    assert not r.routed_by_rule("shop", "secret")  # the deciding rule ignores it
    assert r.route("other", "t") == ("other", "t") and not r.routed_by_rule("other", "t")  # kept by default only
    assert not r.routed_by_rule("other", "") and not r.routed_by_rule("mysql", "user")


def test_a_rule_may_set_the_apply_error_policy_of_the_tables_it_decides() -> None:
    r = Router([Rule("shop.*", schema="copy", on_apply_error="quarantine"), Rule("shop.audit", on_apply_error="skip"),
                Rule("shop.plain")])
    assert r.apply_error_policy("shop", "orders") == "quarantine"
    assert r.apply_error_policy("shop", "audit") == "skip"
    assert r.apply_error_policy("shop", "plain") is None  # the last matching rule decides, as for the route
    assert r.apply_error_policy("other", "t") is None
    with pytest.raises(RuleError, match="must be one of stop, quarantine, skip"):
        Rule("shop.*", on_apply_error="ignore")
    with pytest.raises(RuleError, match="ignores what it matches"):
        Rule("!shop.secret", on_apply_error="quarantine")

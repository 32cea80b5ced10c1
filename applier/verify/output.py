"""The text ``applier verify`` prints: the comparison's report (per table, then a summary) and the self-check's
findings. Pure: results in, text out.
"""

from __future__ import annotations

from typing import Sequence

from applier.sinks.table import shown
from applier.verify.normalise import Canon, Key, sorted_keys
from applier.verify.results import RowDiffs, TableResult, VerifyResult
from applier.verify.selfcheck import Finding

DEFAULT_MAX_KEYS = 20


def _counted(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def show_value(v: Canon) -> str:
    if isinstance(v, bytes):
        return "0x" + v.hex()
    if isinstance(v, str):
        return repr(v)  # quoted, control characters escaped
    return "NULL" if v is None else str(v)


def show_key(names: Sequence[str], key: Key) -> str:
    return ", ".join(f"{shown(n)}={show_value(v)}" for n, v in zip(names, key))


def _listing(label: str, keys: list[str], cap: int) -> list[str]:
    if not keys:
        return []
    out = [f"    {label} ({len(keys)}):"]
    out += [f"      {k}" for k in keys[:cap]]
    if len(keys) > cap:
        out.append(f"      ... and {len(keys) - cap} more")
    return out


def format_table(t: TableResult, max_keys: int = DEFAULT_MAX_KEYS) -> list[str]:
    if t.skipped:
        return [f"  {t.name}: not compared: {t.skipped}"]
    ch = _counted(t.chunks, "chunk")
    if t.chunks_differing:
        ch += f" ({t.chunks_differing} differing)"
    verdict = _counted(t.differences, "difference") if t.differences else "equal"
    lines = [f"  {t.name}: {ch}, {t.rows_upstream} rows upstream, {t.rows_replica} in replica: {verdict}"]
    lines += [f"    schema: {s}" for s in t.schema_problems]
    d, names = t.diffs, t.key_columns
    lines += _listing("missing in replica", [show_key(names, k) for k in sorted_keys(d.missing)], max_keys)
    lines += _listing("extra in replica", [show_key(names, k) for k in sorted_keys(d.extra)], max_keys)
    lines += _listing("different", [
        f"{show_key(names, k)}  columns: {', '.join(shown(t.columns[i]) for i in d.different[k][1])}"
        for k in sorted_keys(d.different)], max_keys)
    return lines


def format_report(r: VerifyResult, max_keys: int = DEFAULT_MAX_KEYS) -> str:
    lines = [f"verify pipeline {r.pipeline}",
             f"  upstream: {r.upstream}",
             f"  replica:  {r.replica}",
             f"  read at:  {r.consistency}"]
    lines += [f"  note: {n}" for n in r.notes]
    for t in r.tables:
        lines += format_table(t, max_keys)
    compared = [t for t in r.tables if not t.skipped]
    skipped = len(r.tables) - len(compared)
    d = RowDiffs()
    for t in compared:
        d.merge(t.diffs)
    schema = sum(len(t.schema_problems) for t in compared)
    tables_diff = sum(1 for t in compared if t.differences)
    summary = (f"summary: {len(compared)} tables compared"
               + (f" ({skipped} not compared)" if skipped else "")
               + f", {sum(t.chunks for t in compared)} chunks ({sum(t.chunks_differing for t in compared)} "
               f"differing), {sum(t.rows_upstream for t in compared)} rows upstream, "
               f"{sum(t.rows_replica for t in compared)} in replica: ")
    if r.differences:
        summary += (f"{r.differences} differences ({len(d.missing)} missing, {len(d.extra)} extra, "
                    f"{len(d.different)} different" + (f", {schema} schema" if schema else "")
                    + f") in {_counted(tables_diff, 'table')}")
    else:
        summary += "equal"
    if not r.consistent:
        summary += " (not at a consistent snapshot: see 'read at')"
    lines.append(summary)
    return "\n".join(lines)


def format_findings(findings: Sequence[Finding]) -> str:
    problems = [f for f in findings if f.problem]
    lines = [("  PROBLEM: " if f.problem else "  ") + f.text for f in findings]
    lines.append(f"result: {len(problems)} problem(s)" if problems else "result: the applier's tables are consistent")
    return "\n".join(lines)

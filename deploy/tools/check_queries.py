"""Every PromQL expression of deploy/ (dashboards, recording and alerting rules), and a check
that each one returns data from a running Prometheus.

    python deploy/tools/check_queries.py --prometheus http://localhost:9090 [--list]

Exit 0 when every expected query returns data; GPU-only queries (they read netgain_gpu_*
series, absent on hosts without a GPU) only have to be valid unless --gpu is given. The
test tests/test_deploy_prometheus.py uses the same functions against a real Prometheus.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parent.parent
RULE_FILES = sorted((DEPLOY / "prometheus" / "rules").glob("*.yml"))
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))

GPU_METRIC = re.compile(r"\bnetgain_gpu_\w+")
CLIENT_METRIC = re.compile(r"\bnetgain_client\w*")
METRIC_NAME = re.compile(r"\b((?:netgain|process)_[a-z0-9_]+)")  # process_*: prometheus_client's

# What Grafana substitutes for its variables when a dashboard is evaluated outside Grafana.
GRAFANA_DEFAULTS = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "5m",
    "$model": ".+",
    "$device": ".+",
}


@dataclass
class Query:
    """One PromQL expression and where it came from."""

    source: str  # "recording", "alert", "dashboard", "variable"
    where: str  # human-readable location: file, group, rule/panel title, refId
    expr: str  # as written (Grafana variables not substituted)
    recorded: str = ""  # name of the recording rule, for "recording"
    depends_on: set[str] = field(default_factory=set)

    @property
    def id(self) -> str:
        return f"{self.source}:{self.where}"


def load_rules(files: list[Path] | None = None) -> list[Query]:
    out: list[Query] = []
    for path in files or RULE_FILES:
        doc = yaml.safe_load(path.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    out.append(
                        Query(
                            "recording",
                            f"{path.name}/{group['name']}/{rule['record']}",
                            rule["expr"].strip(),
                            recorded=rule["record"],
                        )
                    )
                else:
                    out.append(
                        Query("alert", f"{path.name}/{group['name']}/{rule['alert']}", rule["expr"].strip())
                    )
    return out


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in panels:
        out.append(p)
        out.extend(_panels(p.get("panels", [])))
    return out


def load_dashboards(files: list[Path] | None = None) -> list[Query]:
    out: list[Query] = []
    for path in files or DASHBOARDS:
        dash = json.loads(path.read_text())
        for var in dash.get("templating", {}).get("list", []):
            if var.get("type") == "query":
                q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
                out.append(Query("variable", f"{path.name}/${var['name']}", q))
        for p in _panels(dash.get("panels", [])):
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append(Query("dashboard", f"{path.name}/{p['title']}/{t['refId']}", t["expr"]))
    return out


def all_queries() -> list[Query]:
    queries = load_rules() + load_dashboards()
    _resolve_dependencies(queries)
    return queries


def _resolve_dependencies(queries: list[Query]) -> None:
    recorded = {q.recorded: q for q in queries if q.recorded}
    for q in queries:
        q.depends_on = {
            name for name in recorded if re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", q.expr)
        }
    # transitive closure
    changed = True
    while changed:
        changed = False
        for q in queries:
            extra = set().union(*(recorded[d].depends_on for d in q.depends_on)) - q.depends_on
            if extra:
                q.depends_on |= extra
                changed = True


def metric_names(q: Query, queries: list[Query]) -> set[str]:
    """``netgain_*`` and ``process_*`` names an expression reads, directly or through recording rules."""
    recorded = {r.recorded: r for r in queries if r.recorded}
    exprs = [q.expr] + [recorded[d].expr for d in q.depends_on]
    names: set[str] = set()
    for expr in exprs:
        for name in sorted(recorded, key=len, reverse=True):  # recorded names contain metric names
            expr = re.sub(rf"(?<![\w:]){re.escape(name)}(?![\w:])", " ", expr)
        names |= set(METRIC_NAME.findall(expr))
    return names


def is_gpu_only(q: Query, queries: list[Query]) -> bool:
    """Reads only series that exist on GPU hosts (netgain_gpu_*), absent where there is no GPU."""
    names = metric_names(q, queries)
    return bool(names) and all(GPU_METRIC.fullmatch(n) for n in names)


def is_client(q: Query, queries: list[Query]) -> bool:
    """Reads the load generator's client-side metrics (netgain_client_*)."""
    return any(CLIENT_METRIC.fullmatch(n) for n in metric_names(q, queries))


def grafana_to_promql(expr: str, values: dict[str, str] | None = None) -> str:
    """Substitute Grafana variables; ``label_values(SELECTOR, label)`` becomes ``SELECTOR``."""
    subs = {**GRAFANA_DEFAULTS, **(values or {})}
    for key in sorted(subs, key=len, reverse=True):
        expr = expr.replace("${" + key[1:] + "}", subs[key]).replace(key, subs[key])
    m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", expr, re.S)
    if m:
        return m.group(1)
    return expr


_COMPARISON = re.compile(r"(==|!=|>=|<=|>|<)(\s+bool\b)?")
_SETOP = re.compile(r"\b(and|or|unless)\b")


def _top_level(expr: str, pattern: re.Pattern[str]) -> list[re.Match[str]]:
    """Matches of ``pattern`` outside (), {}, [] and quotes."""
    depth = 0
    quote = ""
    top: list[bool] = []
    for ch in expr:
        if quote:
            if ch == quote:
                quote = ""
            top.append(False)
        elif ch in "\"'`":
            quote = ch
            top.append(False)
        else:
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            top.append(depth == 0 and ch not in ")]}")
    return [m for m in pattern.finditer(expr) if all(top[m.start() : m.end()])]


def alert_signals(expr: str) -> list[str]:
    """The data-bearing parts of an alert: ``A > x and B > y`` → ``[A > bool x, B > bool y]``.

    An alert's expression is empty while it does not fire; with ``bool`` each comparison keeps
    every input series (as 0 or 1), so an empty result means a typo or a missing metric.
    """
    expr = expr.strip()
    parts: list[str] = []
    last = 0
    for m in _top_level(expr, _SETOP):
        parts.append(expr[last : m.start()])
        last = m.end()
    parts.append(expr[last:])
    out = []
    for part in (p.strip() for p in parts):
        while part.startswith("(") and part.endswith(")") and _balanced(part[1:-1]):
            part = part[1:-1].strip()
        comps = _top_level(part, _COMPARISON)
        if len(comps) > 1:
            raise ValueError(f"alert part {part!r} has more than one top-level comparison")
        if comps and not comps[0].group(2):
            c = comps[0]
            part = part[: c.end()] + " bool" + part[c.end() :]
        out.append(part)
    return out


def _balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        depth += ch == "("
        depth -= ch == ")"
        if depth < 0:
            return False
    return depth == 0


def instant_query(base_url: str, expr: str, timeout: float = 10.0) -> dict[str, Any]:
    """``/api/v1/query``; returns the decoded JSON (status "success" or "error")."""
    data = urllib.parse.urlencode({"query": expr}).encode()
    req = urllib.request.Request(base_url.rstrip("/") + "/api/v1/query", data=data)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # 400/422 carry an error body
        return json.loads(exc.read() or b'{"status": "error", "error": "empty body"}')


def promql_of(q: Query) -> list[str]:
    """The expressions to evaluate for ``q``: alerts are split into their signals."""
    expr = grafana_to_promql(q.expr) if q.source in ("dashboard", "variable") else q.expr
    return alert_signals(expr) if q.source == "alert" else [expr]


def check(base_url: str, q: Query, require_data: bool) -> str | None:
    """None when fine; otherwise what was wrong."""
    for expr in promql_of(q):
        body = instant_query(base_url, expr)
        if body.get("status") != "success":
            return f"{expr!r}: {body.get('errorType')}: {body.get('error')}"
        if require_data and not body["data"]["result"]:
            return f"{expr!r}: no data"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prometheus", default="http://localhost:9090", help="Prometheus base URL")
    ap.add_argument("--gpu", action="store_true", help="GPU-only queries must return data too")
    ap.add_argument("--no-client", action="store_true", help="client (load generator) queries may be empty")
    ap.add_argument("--list", action="store_true", help="print the queries and exit")
    args = ap.parse_args(argv)
    queries = all_queries()
    bad = 0
    for q in queries:
        gpu, client = is_gpu_only(q, queries), is_client(q, queries)
        tag = "gpu" if gpu else "client" if client else "server"
        if args.list:
            print(f"{tag:7} {q.id}\n        {' ; '.join(promql_of(q))}")
            continue
        need = (args.gpu or not gpu) and not (args.no_client and client)
        err = check(args.prometheus, q, need)
        print(f"{'FAIL' if err else 'ok':4} {tag:7} {q.id}" + (f"\n     {err}" if err else ""))
        bad += err is not None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

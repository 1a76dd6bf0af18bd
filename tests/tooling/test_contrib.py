"""What contrib/ ships for monitoring rackflow: the Prometheus alert rules pass `promtool check rules` and
their tests (`promtool test rules`, Debian's prometheus package: `make tools`), and the Grafana dashboard is
well formed and asks only for metrics rackflow exports (as do the rules)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import get_args

import pytest
import yaml
from prometheus_client import REGISTRY

import rackflow.metrics  # noqa: F401  (registers every rackflow metric)
from rackflow.domain.schedules import Trigger
from rackflow.domain.tasks import TaskStatus
from tests.debian_tools import PROMTOOL, require

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "contrib/prometheus/rackflow-alerts.yml"
RULE_TESTS = ROOT / "contrib/prometheus/rackflow-alerts.test.yml"
DASHBOARD = ROOT / "contrib/grafana/rackflow.json"
METRIC = re.compile(r"\brackflow_[a-z0-9_]+")
# What a firing records of a scope (`schedules/firing.py`: submitted or failed, or settled by its plan).
FIRING_OUTCOMES = ("submitted", "skipped_overlap", "skipped_window", "failed")


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def _exported() -> set[str]:
    """Every series name rackflow's metrics expose (`_total`, `_bucket`, … included), labelled ones too
    (which have no samples until a label is used)."""
    return {
        family.name + suffix
        for family in REGISTRY.collect()
        if family.name.startswith("rackflow_")
        for suffix in SUFFIXES[family.type]
    }


def _promtool(*args: str) -> str:
    done = subprocess.run(
        [str(require(PROMTOOL, "prometheus")), *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_alert_rules_pass_promtool_check() -> None:
    assert "SUCCESS: 10 rules found" in _promtool("check", "rules", str(RULES))


def test_the_alert_rules_pass_their_promtool_tests() -> None:
    assert "SUCCESS" in _promtool("test", "rules", str(RULE_TESTS))


def test_every_rule_has_a_test_and_names_only_exported_metrics() -> None:
    rules = [r for group in yaml.safe_load(RULES.read_text())["groups"] for r in group["rules"]]
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert {r["alert"] for r in rules} == tested
    for rule in rules:
        named = set(METRIC.findall(rule["expr"]))
        assert named and named <= _exported(), (rule["alert"], named - _exported())


def test_the_dashboard_panels_query_only_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert panels and len({p["id"] for p in panels}) == len(panels)
    exported = _exported()
    for panel in panels:
        assert panel["title"] and panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            named = set(METRIC.findall(target["expr"]))
            assert named and named <= exported, (panel["title"], named - exported)
    # Every metric family rackflow exports is on the dashboard, but for the keyed-read and pruning
    # counters (capacity details, in docs/PERFORMANCE.md and the pruners' logs).
    shown = {m for p in panels for t in p["targets"] for m in METRIC.findall(t["expr"])}
    families = {f.name for f in REGISTRY.collect() if f.name.startswith("rackflow_")}
    assert families
    left_out = {"keyed_read", "pruned", "spooled", "replayed"}
    missing = {
        f for f in families if not any(s.startswith(f) for s in shown) and not any(w in f for w in left_out)
    }
    assert missing == set()


OPERATIONS = ROOT / "docs/OPERATIONS.md"
NOTIFICATIONS = ROOT / "docs/NOTIFICATIONS.md"


def _metrics_table() -> dict[str, str]:
    """docs/OPERATIONS.md's "Metrics" table: each metric's row, by its name."""
    section = OPERATIONS.read_text().split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    return {
        match.group(1): match.group(0)
        for match in re.finditer(r"^\| `(rackflow_[a-z0-9_]+)` \|.*$", section, re.MULTILINE)
    }


def test_the_metrics_table_lists_every_metric_rackflow_exports() -> None:
    """rackflow_approval_decisions_total was exported but only docs/SAFETY.md named it."""
    kinds = {"counter": "_total", "histogram": "", "gauge": ""}
    exported = {f.name + kinds[f.type]: f.type for f in REGISTRY.collect() if f.name.startswith("rackflow_")}
    table = _metrics_table()
    assert set(table) == set(exported)
    for name, kind in exported.items():
        assert f"| {kind} |" in table[name], table[name]


def test_the_metrics_table_names_every_value_of_the_firing_labels() -> None:
    """The table said firings were the dispatcher's (`trigger`: `dispatch`) and scopes `submitted`,
    `skipped_overlap` or `failed`: a manual trigger counts as `manual`, a scope a closed window skipped as
    `skipped_window` (`schedules/firing.py`)."""
    firings = _metrics_table()["rackflow_schedule_firings_total"]
    for trigger in get_args(Trigger):
        assert f"`{trigger}`" in firings
    outcomes = _metrics_table()["rackflow_schedule_scope_outcomes_total"]
    for outcome in FIRING_OUTCOMES:
        assert f"`{outcome}`" in outcomes


def test_the_shipped_rules_alert_on_what_the_docs_say_they_ship() -> None:
    """docs/OPERATIONS.md ("Metrics") says contrib/prometheus ships its useful alerts as rules, lost audit
    events and failed scope submissions among them; no rule looked at either."""
    exprs = [r["expr"] for group in yaml.safe_load(RULES.read_text())["groups"] for r in group["rules"]]
    assert any("rackflow_audit_events_lost_total" in e for e in exprs)
    assert any("rackflow_schedule_scope_outcomes_total" in e and 'outcome="failed"' in e for e in exprs)


def test_the_notifications_doc_lists_every_shipped_alert() -> None:
    rules = {r["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for r in group["rules"]}
    section = NOTIFICATIONS.read_text().split("## Shipped alert rules and dashboard", 1)[1]
    listed = set(re.findall(r"^\| `(Rackflow\w+)` \|", section, re.MULTILINE))
    assert listed == rules


@pytest.mark.parametrize(
    ("name", "label", "values"),
    [
        ("rackflow_schedule_firings_total", "trigger", get_args(Trigger)),
        ("rackflow_schedule_scope_outcomes_total", "outcome", FIRING_OUTCOMES),
        ("rackflow_tasks_finished_total", "status", tuple(s.value for s in TaskStatus if not s.is_active)),
        ("rackflow_approval_decisions_total", "decision", ("approved", "rejected", "expired")),
    ],
)
def test_labelled_counters_with_known_values_are_exported_at_zero_from_the_start(
    name: str, label: str, values: tuple[str, ...]
) -> None:
    """`increase()` and `rate()` start from a series' first sample: a series that first appeared at 1 (an
    instance's first failed scope since it started, `outcome="failed"`) raised no `increase(…) > 0`
    alert. Each value known in advance is a series from start-up on, at 0 until it counts."""
    for value in values:
        assert REGISTRY.get_sample_value(name, {label: value}) is not None, (name, value)

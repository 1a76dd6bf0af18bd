"""What contrib/ ships for monitoring rackflow: the Prometheus alert rules pass `promtool check rules` and
their tests (`promtool test rules`, Debian's prometheus package: `make tools`), and the Grafana dashboard is
well formed and asks only for metrics rackflow exports (as do the rules)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml
from prometheus_client import REGISTRY

import rackflow.metrics  # noqa: F401  (registers every rackflow metric)
from tests.debian_tools import PROMTOOL, require

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "contrib/prometheus/rackflow-alerts.yml"
RULE_TESTS = ROOT / "contrib/prometheus/rackflow-alerts.test.yml"
DASHBOARD = ROOT / "contrib/grafana/rackflow.json"
METRIC = re.compile(r"\brackflow_[a-z0-9_]+")


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
    assert "SUCCESS: 8 rules found" in _promtool("check", "rules", str(RULES))


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

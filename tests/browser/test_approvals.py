"""Approval on the run's page in headless Chromium against a real `rackflow serve` that requires tokens
(docs/SAFETY.md, "Approval"): an operator is offered no Approve or Reject, the schedule's last editor is
refused by the two-person rule with the reason in the dialog, another approver approves with a comment and
sees the run start; a second run is rejected with its reason; an operator's edit form keeps a schedule's
approval on and its approvers needed, and its Delete is disabled, each saying why. The buttons post through
the dashboard's JSON API and its security (the token, the same-origin check). Roles do not depend on the
database: SQLite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver

from rackflow.security import hash_token
from rackflow.v1 import flow_pb2 as pb
from tests.browser.page import SHOTS, by_testid, text, visible, wait
from tests.browser.test_forms import field
from tests.browser.test_tokens import give_token
from tests.e2e.cluster import ServerProcess, start_server
from tests.e2e.fleet import schedule_request

pytestmark = pytest.mark.slow

OPERATOR, EDITOR, APPROVER = "browser-op-51e0", "browser-editor-62f1", "browser-approver-7302"


def _as(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture(scope="module")
def server(served_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("approvals")
    url = served_db_url
    started = start_server(
        url,
        directory,
        args=["--http-listen", "127.0.0.1:0"],
        env={
            "RACKFLOW_AUTH_TOKEN_ONCALL": f"operator:{hash_token(OPERATOR)}",
            "RACKFLOW_AUTH_TOKEN_EDITOR": f"approver:{hash_token(EDITOR)}",
            "RACKFLOW_AUTH_TOKEN_LEAD": f"approver:{hash_token(APPROVER)}",
        },
        name="approvals",
    )
    stub = started.stub()
    for name in ("a1", "a2"):
        component = pb.ComponentSpec(type=pb.COMPONENT_TYPE_COMPUTE, name=f"{name}-c0")
        stub.CreateRack(pb.CreateRackRequest(name=name, components=[component]), metadata=_as(EDITOR))
    for name, rack in (("gated", "a1"), ("gated-2", "a2")):
        request = schedule_request(name, [rack], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h")
        request.schedule.approval.CopyFrom(pb.ApprovalPolicy(required=True, timeout="4h"))
        schedule = stub.CreateTaskSchedule(request, metadata=_as(EDITOR))
        stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id), metadata=_as(OPERATOR))
    yield started
    assert started.stop() == 0, started.output


def _run_url(server: ServerProcess, schedule: str) -> str:
    stub = server.stub()
    found = stub.GetTaskSchedule(
        pb.GetTaskScheduleRequest(id=pb.UUID(id=_schedule_id(server, schedule))), metadata=_as(OPERATOR)
    )
    (run,) = stub.ListTaskScheduleRuns(
        pb.ListTaskScheduleRunsRequest(schedule_id=found.id), metadata=_as(OPERATOR)
    ).runs
    return f"{server.http_url}/runs/{run.id.id}"


def _schedule_id(server: ServerProcess, name: str) -> str:
    listed = server.stub().ListTaskSchedules(
        pb.ListTaskSchedulesRequest(name_contains=name), metadata=_as(OPERATOR)
    )
    return next(s.id.id for s in listed.task_schedules if s.name == name)


def _actions(driver: WebDriver) -> list[str]:
    return [
        str(b.get_attribute("data-testid"))
        for b in driver.find_elements(By.CSS_SELECTOR, "button[data-post]")
    ]


def _act(driver: WebDriver, action: str, field: str, value: str) -> None:
    visible(driver, action).click()
    visible(driver, "confirm-dialog")
    visible(driver, field).send_keys(value)
    visible(driver, "confirm-ok").click()


def test_an_operator_sees_no_approval_and_the_editor_is_refused(
    server: ServerProcess, driver: WebDriver
) -> None:
    driver.get(_run_url(server, "gated"))
    give_token(driver, OPERATOR)
    wait(driver, lambda d: "awaiting approval" in text(d, "run-state"), "the run awaiting approval")
    assert "awaiting 1 more of 1 approver" in text(driver, "run-approval")
    assert {r.get_attribute("data-outcome") for r in by_testid(driver, "run-rack")} == {"pending"}
    assert "action-approve-run" not in _actions(driver) and "action-reject-run" not in _actions(driver)

    driver.find_element(By.ID, "forget-token").click()
    give_token(driver, EDITOR)
    _act(driver, "action-approve-run", "approve-comment", "mine")
    refusal = wait(
        driver,
        lambda d: "last edited the schedule" in text(d, "confirm-error") and text(d, "confirm-error"),
        "the two-person rule's refusal, in the dialog",
    )
    assert "'editor' last edited the schedule and may not approve or reject its runs" in refusal
    assert visible(driver, "approve-comment").get_attribute("value") == "mine"  # what was typed is kept


def test_another_approver_approves_and_the_run_starts(server: ServerProcess, driver: WebDriver) -> None:
    driver.get(_run_url(server, "gated"))
    give_token(driver, APPROVER)
    wait(driver, lambda d: "awaiting approval" in text(d, "run-state"), "the run awaiting approval")
    _act(driver, "action-approve-run", "approve-comment", "checked CHG-2231")
    wait(driver, lambda d: by_testid(d, "run-task-link"), "the run's task, without a reload")
    assert text(driver, "flash") == "Approved the run"
    assert text(driver, "run-approver").startswith("lead") and text(driver, "run-approver").endswith(
        "checked CHG-2231"
    )
    assert "action-approve-run" not in _actions(driver)


def test_an_approver_rejects_with_a_reason(server: ServerProcess, driver: WebDriver) -> None:
    driver.get(f"{server.http_url}/schedules/gated-2")
    give_token(driver, APPROVER)
    wait(driver, lambda d: text(d, "schedule-approval"), "the schedule's approval policy")
    assert text(driver, "schedule-approval") == "1 approver within 4h · last edited by editor"
    driver.get(_run_url(server, "gated-2"))  # the token is kept
    wait(driver, lambda d: "awaiting approval" in text(d, "run-state"), "the run awaiting approval")
    _act(driver, "action-reject-run", "reject-comment", "not during the freeze")
    wait(driver, lambda d: "rejected" in text(d, "run-state"), "the run rejected, without a reload")
    assert text(driver, "run-reason") == "rejected by lead: not during the freeze"
    assert {r.get_attribute("data-outcome") for r in by_testid(driver, "run-rack")} == {"not_started"}


def test_an_operator_is_offered_no_weaker_approval_gate(server: ServerProcess, driver: WebDriver) -> None:
    """An operator's edit form of a schedule needing 2 approvers (the operator edited it last, so 'editor'
    and 'lead' may approve) keeps approval on and its approvers needed at 2 or more, saying why; what the
    operator may change still saves, the policy with it; the schedule's Delete is disabled, saying why.
    (tests/web/test_page_roles.py checks both pages for each role.)"""
    request = schedule_request("held", ["a1"], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h")
    request.schedule.approval.CopyFrom(pb.ApprovalPolicy(required=True, timeout="4h", min_approvers=2))
    server.stub().CreateTaskSchedule(request, metadata=_as(OPERATOR))
    driver.get(f"{server.http_url}/schedules/held/edit")
    give_token(driver, OPERATOR)
    wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, "main h1").text == "Edit held", "the edit form")
    assert text(driver, "approval-locked") == (
        "Only the approver role may remove or lower this schedule's approval (docs/SAFETY.md): it stays "
        "on, with at least 2 approvers."
    )
    approval = visible(driver, "form-approval-on")
    approval.click()
    assert approval.is_selected() and not approval.is_enabled()
    needed = visible(driver, "form-approval-min_approvers")
    needed.send_keys(Keys.ARROW_DOWN)  # a number input stops at its min
    assert needed.get_attribute("value") == "2"
    driver.save_screenshot(str(SHOTS / "schedule-form-approval-held.png"))

    field(driver, "form-approval-timeout", "8h")
    visible(driver, "form-save").click()
    wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, "main h1").text == "held", "the schedule's page")
    assert text(driver, "schedule-approval") == "2 approvers within 8h · last edited by oncall"
    assert not visible(driver, "action-delete").is_enabled()
    assert text(driver, "delete-locked").startswith("Only the approver role may delete this schedule")

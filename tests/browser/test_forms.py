"""The dashboard's forms in a real headless Chromium against a real `rackflow serve`: a schedule made in
the form fires (triggered) and its run page shows it; a bad field is named next to it while typing and
what was typed stays; a schedule targets an NVLink domain with a component filter; a schedule's racks
are edited; a window and a budget are made (the budget changed) and deleted; an approval policy is set (a
bad value named beside its field), previewed (each next firing awaiting approval), changed and removed. (A
viewer is offered no form: tests/browser/test_tokens.py.)"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from rackflow.v1 import flow_pb2 as pb
from tests.browser.page import SHOTS, by_testid, read, text, visible, wait
from tests.browser.test_dashboard import confirm, h1, open_page
from tests.e2e.cluster import ServerProcess, start_server
from tests.e2e.fleet import create_racks, create_schedules, rfc3339, schedule_request, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(served_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("forms")
    url = served_db_url
    started = start_server(
        url,
        directory,
        args=["--http-listen", "127.0.0.1:0"],
        env={"RACKFLOW_SIM_STEP_SECONDS": "1"},
        name="forms",
    )
    stub = started.stub()
    # f4 is reset by the first test and nothing else: the later tests preview f2 and f3 as "fire", which a
    # rack still busy with that reset would not be.
    racks = create_racks(stub, ["f1", "f2", "f3", "f4"])
    stub.CreateNVLDomain(pb.CreateNVLDomainRequest(name="d1", rack_ids=[r.id for r in racks[1:3]]))
    create_schedules(
        stub,
        [schedule_request("editable", ["f1", "f2"], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h")],
    )
    yield started
    assert started.stop() == 0, started.output


def field(driver: WebDriver, testid: str, value: str) -> None:
    element = visible(driver, testid)
    element.clear()
    element.send_keys(value)


def tick(driver: WebDriver, testid: str, on: bool = True) -> None:
    """Set a checkbox by clicking it, again if a click was lost: ChromeDriver clicks at a point, and the
    preview redrawn meanwhile (300 ms after the last change) may move the box from under it."""

    def settled(d: WebDriver) -> bool:
        box = visible(d, testid)
        if box.is_selected() != on:
            box.click()
        return bool(box.is_selected() == on)

    wait(driver, settled, f"{testid} {'checked' if on else 'unchecked'}")


def offered(driver: WebDriver) -> list[str]:
    """The names the scope picker offers now."""
    return read(driver, lambda d: [str(o.get_attribute("data-name")) for o in by_testid(d, "scope-option")])


def add_rack(driver: WebDriver, name: str) -> None:
    """Type part of a rack's (or, picking domains, a domain's) name, and pick it from the names offered:
    the page lists none of them."""
    visible(driver, "scope-pick").send_keys(name[1:].upper())  # any case
    wait(driver, lambda d: name in offered(d), f"{name} offered")
    option = driver.find_element(By.CSS_SELECTOR, f'[data-testid="scope-option"][data-name="{name}"]')
    option.click()
    wait(driver, lambda d: name in chosen(d), f"{name} added")


def chosen(driver: WebDriver) -> list[str]:
    return read(
        driver,
        lambda d: [
            str(li.get_attribute("data-name")) for li in d.find_elements(By.CSS_SELECTOR, ".chosen li")
        ],
    )


def decisions(driver: WebDriver) -> list[tuple[str, str]]:
    """The first previewed firing's (rack, decision) pairs (the preview is redrawn as the form changes)."""
    return read(
        driver,
        lambda d: [
            (str(e.get_attribute("data-rack")), str(e.get_attribute("data-decision")))
            for e in d.find_elements(
                By.CSS_SELECTOR, '[data-testid="preview-firing"]:first-child [data-testid="preview-decision"]'
            )
        ],
    )


def test_a_schedule_made_in_the_form_fires_and_its_run_page_shows_it(
    server: ServerProcess, driver: WebDriver
) -> None:
    open_page(driver, server, "/schedules", "Schedules")
    visible(driver, "new-schedule").click()
    wait(driver, lambda d: h1(d) == "New schedule", "the form")
    field(driver, "form-name", "made-here")
    field(driver, "form-timezone", "America/New_York")
    Select(visible(driver, "form-operation")).select_by_value("power_reset")
    add_rack(driver, "f1")
    add_rack(driver, "f4")
    assert chosen(driver) == ["f1", "f4"]
    # The next firings, planned as the dispatcher would: in the schedule's zone, the viewer's (Berlin) beside.
    wait(driver, lambda d: decisions(d) == [("f1", "fire"), ("f4", "fire")], "each rack's decision")
    first = text(driver, "preview-firing")
    assert "02:00 EST" in first or "02:00 EDT" in first, first
    assert "yours:" in first and ("CET" in first or "CEST" in first or "GMT+" in first), first
    visible(driver, "form-save").click()

    wait(driver, lambda d: h1(d) == "made-here", "the new schedule's page")
    assert text(driver, "schedule-summary") == "Power Reset"
    assert confirm(driver, "action-trigger") == "Run made-here now?"
    visible(driver, "grid-run-link").click()
    wait(driver, lambda d: h1(d).startswith("Firing of"), "the run page")
    assert text(driver, "run-schedule") == "made-here"
    wait(
        driver,
        lambda d: sorted(e.text.split()[0] for e in by_testid(d, "run-rack") if e.text) == ["f1", "f4"],
        "both racks on the run page",
    )


def test_a_schedule_targets_a_domain_and_some_of_its_components(
    server: ServerProcess, driver: WebDriver
) -> None:
    open_page(driver, server, "/schedules/new", "New schedule")
    field(driver, "form-name", "domain-wide")
    visible(driver, "form-scope-domains").click()
    add_rack(driver, "d1")
    driver.find_element(By.CSS_SELECTOR, 'input[value="COMPONENT_TYPE_COMPUTE"]').click()
    # The domain's racks, in whatever order the domain lists them (not by name).
    wait(driver, lambda d: sorted(decisions(d)) == [("f2", "fire"), ("f3", "fire")], "the domain's racks")
    visible(driver, "form-save").click()
    wait(driver, lambda d: h1(d) == "domain-wide", "the new schedule's page")
    rows = [r.text.split()[:2] for r in by_testid(driver, "scope-row")]
    assert rows == [["f2", "COMPUTE"], ["f3", "COMPUTE"]], rows


def test_a_rack_is_picked_from_the_keyboard_and_a_name_of_no_rack_is_refused_at_once(
    server: ServerProcess, driver: WebDriver
) -> None:
    """Typing part of a name offers the racks that hold it (asked of the server as you type); arrows and
    Enter pick one, Enter does not save the form; a name that is no rack's is refused beside the picker,
    before anything is saved, and what was chosen stays."""
    open_page(driver, server, "/schedules/new", "New schedule")
    field(driver, "form-name", "keyboard")
    box = visible(driver, "scope-pick")
    box.send_keys("F")
    wait(driver, lambda d: offered(d) == ["f1", "f2", "f3", "f4"], "the racks holding f")
    box.send_keys(Keys.ARROW_DOWN, Keys.ARROW_DOWN)
    assert box.get_attribute("aria-activedescendant") == "scope-option-1"
    box.send_keys(Keys.ENTER)
    wait(driver, lambda d: chosen(d) == ["f2"], "f2 added")
    assert box.get_attribute("value") == "" and h1(driver) == "New schedule"
    box.send_keys("f9")
    wait(driver, lambda d: "No rack's name holds “f9”." in text(d, "scope-options"), "nothing offered")
    box.send_keys(Keys.ENTER)
    refusal = "No rack is named “f9”: pick one of the names offered as you type."
    wait(driver, lambda d: text(d, "scope-pick-error") == refusal, "the refusal")
    assert box.get_attribute("aria-invalid") == "true" and chosen(driver) == ["f2"]
    box.clear()
    box.send_keys("f3", Keys.ENTER)  # typed in full, without waiting for the names offered
    wait(driver, lambda d: chosen(d) == ["f2", "f3"], "f3 added")
    assert not by_testid(driver, "scope-pick-error")[0].is_displayed()
    wait(driver, lambda d: decisions(d) == [("f2", "fire"), ("f3", "fire")], "the preview of both")
    visible(driver, "form-save").click()
    wait(driver, lambda d: h1(d) == "keyboard", "the new schedule's page")
    rows = [r.text.split()[0] for r in by_testid(driver, "scope-row")]
    assert rows == ["f2", "f3"], rows


def test_a_refused_name_stays_marked_while_the_preview_redraws(
    server: ServerProcess, driver: WebDriver
) -> None:
    """A preview answered after the picker refused a name (its draft changed elsewhere, or asked before the
    refusal and answered after it) clears the form's errors, not the picker's own: the name stays marked
    invalid beside its refusal until the picker is typed in. A preview landing between the refusal and its
    check made the keyboard test above fail now and then (`aria-invalid` gone, the refusal shown)."""
    open_page(driver, server, "/schedules/new", "New schedule")
    field(driver, "form-name", "redrawn")
    add_rack(driver, "f2")
    wait(driver, lambda d: decisions(d) == [("f2", "fire")], "the preview of f2")
    box = visible(driver, "scope-pick")
    box.send_keys("f9")
    wait(driver, lambda d: "No rack's name holds “f9”." in text(d, "scope-options"), "nothing offered")
    box.send_keys(Keys.ENTER)
    refusal = "No rack is named “f9”: pick one of the names offered as you type."
    wait(driver, lambda d: text(d, "scope-pick-error") == refusal, "the refusal")
    field(driver, "form-spec", "17 5 * * *")  # the draft changes: the preview asks again, and succeeds
    wait(
        driver,
        lambda d: "05:17" in text(d, "preview-firing") and decisions(d) == [("f2", "fire")],
        "the preview of the new spec",
    )
    assert text(driver, "scope-pick-error") == refusal
    assert box.get_attribute("aria-invalid") == "true"
    box.send_keys(Keys.BACKSPACE)  # typing in the picker takes the refusal back
    wait(driver, lambda d: not by_testid(d, "scope-pick-error")[0].is_displayed(), "the refusal gone")
    assert box.get_attribute("aria-invalid") is None


def test_a_bad_field_is_named_beside_it_while_typing_and_the_input_stays(
    server: ServerProcess, driver: WebDriver
) -> None:
    open_page(driver, server, "/schedules/new", "New schedule")
    field(driver, "form-name", "typo")
    add_rack(driver, "f2")
    field(driver, "form-timezone", "Mars/Olympus")
    error = visible(driver, "error-schedule.spec.timezone")  # no Save needed: the preview asks as you type
    assert "Mars/Olympus" in read(driver, lambda d: error.text)
    assert visible(driver, "form-timezone").get_attribute("aria-invalid") == "true"
    visible(driver, "form-save").click()  # refused by the server too, nothing lost
    wait(driver, lambda d: "Mars/Olympus" in text(d, "error-schedule.spec.timezone"), "the create's error")
    assert visible(driver, "form-timezone").get_attribute("value") == "Mars/Olympus"
    assert visible(driver, "form-name").get_attribute("value") == "typo" and chosen(driver) == ["f2"]
    tick(driver, "form-rollout-on")
    field(driver, "form-rollout-max_concurrent_racks", "2")
    field(driver, "form-timezone", "Europe/Berlin")
    wait(
        driver, lambda d: not by_testid(d, "error-schedule.spec.timezone")[0].is_displayed(), "the error gone"
    )
    wait(driver, lambda d: decisions(d) == [("f2", "fire")], "the preview back")


def test_a_schedules_racks_are_edited(server: ServerProcess, driver: WebDriver) -> None:
    open_page(driver, server, "/schedules/editable", "editable")
    visible(driver, "action-edit").click()
    wait(driver, lambda d: h1(d) == "Edit editable", "the edit form")
    assert chosen(driver) == ["f1", "f2"]
    visible(driver, "scope-chosen").find_element(By.CSS_SELECTOR, 'li[data-name="f1"] button').click()
    add_rack(driver, "f3")
    wait(driver, lambda d: decisions(d) == [("f2", "fire"), ("f3", "fire")], "the edit's preview")
    field(driver, "form-spec", "12h")
    visible(driver, "form-save").click()
    wait(driver, lambda d: h1(d) == "editable", "back on the schedule")
    wait(
        driver,
        lambda d: [r.text.split()[0] for r in by_testid(d, "scope-row")] == ["f2", "f3"],
        "the new scope",
    )
    assert "12h" in driver.find_element(By.CSS_SELECTOR, "[data-live=config]").text


def test_a_window_and_a_budget_are_made_and_deleted(server: ServerProcess, driver: WebDriver) -> None:
    open_page(driver, server, "/windows", "Maintenance windows")
    visible(driver, "new-window").click()
    wait(driver, lambda d: h1(d) == "New maintenance window", "the window form")
    field(driver, "form-name", "nights")
    field(driver, "form-duration", "soon")
    visible(driver, "form-save").click()
    wait(driver, lambda d: "soon" in text(d, "error-window.recurring.duration"), "the duration's error")
    field(driver, "form-duration", "4h")
    field(driver, "form-racks", "f1, f2")
    visible(driver, "form-save").click()
    wait(
        driver,
        lambda d: [r.get_attribute("data-name") for r in by_testid(d, "window-row")] == ["nights"],
        "it",
    )
    assert "f1, f2" in text(driver, "window-row")

    visible(driver, "new-budget").click()
    wait(driver, lambda d: h1(d) == "New operation budget", "the budget form")
    field(driver, "form-name", "resets")
    visible(driver, "form-op-power_reset").click()
    field(driver, "form-max-running", "2")
    visible(driver, "form-save").click()
    wait(driver, lambda d: len(by_testid(d, "budget-row")) == 1, "the budget")
    assert "0 of 2" in text(driver, "budget-running")
    visible(driver, "budget-edit").click()
    wait(driver, lambda d: h1(d) == "Edit budget resets", "the budget's edit form")
    field(driver, "form-max-running", "3")
    visible(driver, "form-save").click()
    wait(driver, lambda d: "0 of 3" in text(d, "budget-running"), "the budget changed")

    assert confirm(driver, "window-delete") == "Delete window nights?"
    wait(driver, lambda d: not by_testid(d, "window-row"), "the window gone")
    assert "Deleted nights" in visible(driver, "flash").text
    assert confirm(driver, "budget-delete") == "Delete budget resets?"
    wait(driver, lambda d: not by_testid(d, "budget-row"), "the budget gone")
    assert "Deleted resets" in visible(driver, "flash").text


def test_a_schedule_deleted_from_its_page_is_said_deleted_on_the_list(
    server: ServerProcess, driver: WebDriver
) -> None:
    server.stub().CreateTaskSchedule(
        schedule_request("doomed-here", ["f1"], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h")
    )
    open_page(driver, server, "/schedules/doomed-here", "doomed-here")
    assert confirm(driver, "action-delete") == "Delete doomed-here?"
    wait(driver, lambda d: d.current_url.endswith("/schedules") and h1(d) == "Schedules", "the list")
    notice = visible(driver, "flash").text
    driver.save_screenshot(str(SHOTS / "schedule-deleted.png"))
    assert notice == "Deleted doomed-here", notice
    assert "doomed-here" not in [r.get_attribute("data-name") for r in by_testid(driver, "schedule-row")]
    driver.refresh()  # said once: a reload of the list does not say it again
    wait(driver, lambda d: h1(d) == "Schedules", "the list again")
    assert not driver.find_element(By.CSS_SELECTOR, '[data-testid="flash"]').is_displayed()


def test_a_start_deadline_is_set_in_the_form_and_a_missed_run_shows_how_late(
    server: ServerProcess, driver: WebDriver
) -> None:
    open_page(driver, server, "/schedules/new", "New schedule")
    field(driver, "form-name", "guarded")
    add_rack(driver, "f1")
    field(driver, "form-start-deadline", "soon")
    error = visible(driver, "error-schedule.start_deadline")  # named while typing, by the preview
    assert "soon" in read(driver, lambda d: error.text)
    field(driver, "form-start-deadline", "15m")
    field(driver, "form-pause-after", "3")
    wait(driver, lambda d: not by_testid(d, "error-schedule.start_deadline")[0].is_displayed(), "no error")
    visible(driver, "form-save").click()
    wait(driver, lambda d: h1(d) == "guarded", "the new schedule's page")
    assert text(driver, "schedule-start-deadline").startswith("15m")
    assert text(driver, "schedule-pause-after") == "3 consecutive failing runs"

    # A one-time slot an hour ago with a one-minute deadline: the dispatcher records it missed.
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    request = schedule_request(
        "late-one", ["f2"], spec_type=pb.SCHEDULE_SPEC_TYPE_ONE_TIME, spec=rfc3339(an_hour_ago)
    )
    request.schedule.start_deadline = "1m"
    stub = server.stub()
    late_one = stub.CreateTaskSchedule(request)
    runs = pb.ListTaskScheduleRunsRequest(schedule_id=late_one.id)
    wait_until(lambda: bool(stub.ListTaskScheduleRuns(runs).runs), timeout=30, what="the missed run")
    open_page(driver, server, "/schedules/late-one", "late-one")
    visible(driver, "grid-run-link").click()
    wait(driver, lambda d: h1(d).startswith("Firing of"), "the run page")
    assert "late, past its start deadline" in text(driver, "run-late-by")
    assert "past its start deadline of 1m" in text(driver, "run-reason")


def awaiting(driver: WebDriver) -> list[bool]:
    """For each previewed firing, whether the preview marks it as awaiting approval."""
    return read(
        driver,
        lambda d: [
            f.get_attribute("data-needs-approval") is not None for f in by_testid(d, "preview-firing")
        ],
    )


def test_an_approval_policy_is_set_named_when_bad_previewed_and_edited(
    server: ServerProcess, driver: WebDriver
) -> None:
    open_page(driver, server, "/schedules/new", "New schedule")
    field(driver, "form-name", "approved")
    add_rack(driver, "f3")
    wait(driver, lambda d: [rack for rack, _ in decisions(d)] == ["f3"], "the preview")
    assert not any(awaiting(driver))
    tick(driver, "form-approval-on")
    field(driver, "form-approval-timeout", "4h")
    field(driver, "form-approval-min_approvers", "12")
    # The preview runs as you type, so "1" is judged too: wait for the verdict on the whole value.
    wait(
        driver,
        lambda d: "must be 1..10 (0 means 1), got 12" in text(d, "error-schedule.approval.min_approvers"),
        "the preview's error on 12",
    )
    assert visible(driver, "form-approval-min_approvers").get_attribute("value") == "12"  # kept
    # This server has no tokens: every caller is one 'anonymous', so no two approvers can be told apart.
    field(driver, "form-approval-min_approvers", "2")
    wait(
        driver,
        lambda d: (
            "2 approvers needed, but only 1 principal may approve"
            in text(d, "error-schedule.approval.min_approvers")
        ),
        "the preview's error on 2",
    )
    field(driver, "form-approval-min_approvers", "1")
    wait(driver, lambda d: (marks := awaiting(d)) and all(marks), "every next firing to await approval")
    visible(driver, "form-save").click()
    wait(driver, lambda d: h1(d) == "approved", "the new schedule's page")
    assert text(driver, "schedule-approval").startswith("1 approver within 4h")

    visible(driver, "action-edit").click()
    wait(driver, lambda d: h1(d) == "Edit approved", "the edit form")
    assert visible(driver, "form-approval-on").is_selected()
    assert visible(driver, "form-approval-timeout").get_attribute("value") == "4h"
    assert visible(driver, "form-approval-min_approvers").get_attribute("value") == "1"
    wait(driver, lambda d: (marks := awaiting(d)) and all(marks), "the edit's preview awaiting approval")
    field(driver, "form-approval-timeout", "8h")
    visible(driver, "form-save").click()
    wait(driver, lambda d: h1(d) == "approved", "back on the schedule")
    wait(
        driver,
        lambda d: text(d, "schedule-approval").startswith("1 approver within 8h"),
        "the changed policy",
    )

    visible(driver, "action-edit").click()
    wait(driver, lambda d: h1(d) == "Edit approved", "the edit form again")
    tick(driver, "form-approval-on", on=False)
    wait(driver, lambda d: (marks := awaiting(d)) and not any(marks), "no firing awaiting approval")
    visible(driver, "form-save").click()
    wait(driver, lambda d: h1(d) == "approved", "back on the schedule")
    wait(
        driver,
        lambda d: text(d, "schedule-approval") == "none: firings start at once",
        "the policy removed",
    )


def saved(server: ServerProcess, name: str) -> pb.TaskSchedule:
    found = server.stub().ListTaskSchedules(pb.ListTaskSchedulesRequest()).task_schedules
    (schedule,) = [s for s in found if s.name == name]
    return schedule


def test_an_edit_refused_for_its_racks_saves_nothing(server: ServerProcess, driver: WebDriver) -> None:
    """Save of an edit is two requests (the settings, then the racks): a draft the server refuses is
    refused before either, so the page's error does not hide settings saved under it."""
    create_schedules(
        server.stub(),
        [schedule_request("half-saved", ["f1"], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h")],
    )
    open_page(driver, server, "/schedules/half-saved/edit", "Edit half-saved")
    field(driver, "form-spec", "6h")
    visible(driver, "scope-chosen").find_element(By.CSS_SELECTOR, 'li[data-name="f1"] button').click()
    visible(driver, "form-save").click()
    wait(driver, lambda d: "the target list is empty" in text(d, "error-target_spec"), "the racks' refusal")
    assert h1(driver) == "Edit half-saved" and visible(driver, "form-spec").get_attribute("value") == "6h"
    assert saved(server, "half-saved").spec.spec == "24h"  # nothing saved: not the new spec either


# The page's PUT of a schedule's racks is answered with a refusal, as when a rack named in the form was
# deleted between the draft's check and the Save: the settings were saved before it.
REFUSE_THE_RACKS = """
const original = window.fetch;
window.fetch = async (url, init) => {
  if (String(url).endsWith("/scopes") && init && init.method === "PUT") {
    const field = "desired_scope.racks[0]";
    const body = {code: "NOT_FOUND", message: `${field}: rack 'f1' not found`, field};
    return new Response(JSON.stringify(body), {status: 404, headers: {"Content-Type": "application/json"}});
  }
  return original(url, init);
};
"""


def test_an_edit_whose_racks_are_refused_after_its_settings_says_what_was_saved(
    server: ServerProcess, driver: WebDriver
) -> None:
    create_schedules(
        server.stub(),
        [schedule_request("settings-only", ["f1"], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h")],
    )
    open_page(driver, server, "/schedules/settings-only/edit", "Edit settings-only")
    field(driver, "form-spec", "6h")
    wait(driver, lambda d: decisions(d) == [("f1", "fire")], "the draft's preview")
    driver.execute_script(REFUSE_THE_RACKS)
    visible(driver, "form-save").click()
    said = wait(driver, lambda d: text(d, "error-target_spec"), "the racks' refusal")
    assert said == "Its settings were saved, but not its racks: desired_scope.racks[0]: rack 'f1' not found"
    assert saved(server, "settings-only").spec.spec == "6h"


# The preview's answers held back 2 s and counted (window.previews: asked, answered), so one asked just
# before a save lands after the save's answer.
SLOW_PREVIEWS = """
window.previews = {asked: 0, answered: 0};
const beforeSlow = window.fetch;
window.fetch = async (url, init) => {
  if (!String(url).endsWith("/previews/schedule")) return beforeSlow(url, init);
  window.previews.asked += 1;
  const answer = await beforeSlow(url, init);
  await new Promise((resolve) => setTimeout(resolve, 2000));
  window.previews.answered += 1;
  return answer;
};
"""


def _gaps(driver: WebDriver) -> set[timedelta]:
    """The times between the preview's firings, as shown in UTC to the minute."""
    shown = [
        f.find_element(By.CSS_SELECTOR, ".when strong").text for f in by_testid(driver, "preview-firing")
    ]
    times = [datetime.strptime(s.removesuffix(" UTC"), "%Y-%m-%d %H:%M") for s in shown]
    return {later - earlier for earlier, later in itertools.pairwise(times)}


def test_a_save_s_refusal_stays_when_a_preview_asked_before_it_lands_after(
    server: ServerProcess, driver: WebDriver
) -> None:
    """Saved straight after typing, before the draft's preview answered: the preview's answer, landing
    after the save's refusal, would clear the form's errors, the refusal with them (the edit above failed
    now and then on a loaded machine so). The save drops every preview asked before it, and once refused
    previews the draft it sent again, keeping its refusal: the panel shows the 6-hourly firings typed."""
    create_schedules(
        server.stub(),
        [schedule_request("saved-first", ["f1"], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h")],
    )
    open_page(driver, server, "/schedules/saved-first/edit", "Edit saved-first")
    wait(driver, lambda d: decisions(d) == [("f1", "fire")], "the opening preview")
    driver.execute_script(SLOW_PREVIEWS + REFUSE_THE_RACKS)
    field(driver, "form-spec", "6h")
    time.sleep(0.5)  # the typing's pause (300 ms) is over: its preview is asked, and held back
    visible(driver, "form-save").click()
    refusal = "Its settings were saved, but not its racks: desired_scope.racks[0]: rack 'f1' not found"
    wait(driver, lambda d: text(d, "error-target_spec") == refusal, "the racks' refusal")
    held = "return window.previews.asked > 0 && window.previews.answered === window.previews.asked"
    wait(driver, lambda d: d.execute_script(held), "every held preview answered")
    wait(driver, lambda d: _gaps(d) == {timedelta(hours=6)}, "the preview of the draft saved")
    assert text(driver, "error-target_spec") == refusal
    assert saved(server, "saved-first").spec.spec == "6h"
    driver.save_screenshot(str(SHOTS / "schedule-edit-racks-refused.png"))


def test_a_new_form_opens_without_an_error_and_previews_once_racks_are_chosen(
    server: ServerProcess, driver: WebDriver
) -> None:
    """Nothing typed yet is nothing wrong: a new schedule's form opens with no error beside its racks (it
    has none chosen), and previews once the operator has chosen one."""
    open_page(driver, server, "/schedules/new", "New schedule")
    time.sleep(1)  # longer than a preview takes here (the form asked for one as it opened)
    shown = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "[data-error-for]") if e.is_displayed()]
    assert shown == []
    status = driver.find_element(By.CSS_SELECTOR, "[data-preview-status]").text
    assert status == "Fill in the form to see when it fires and what each rack would do."
    add_rack(driver, "f2")
    wait(driver, lambda d: decisions(d) == [("f2", "fire")], "the preview")

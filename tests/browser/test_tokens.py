"""The dashboard of a server that requires bearer tokens, in headless Chromium: the page asks for a token
once, keeps it, offers a viewer no action and no form and an operator every one, and forgets the token when
told to.

Tokens and roles do not depend on the database (tests/web covers them on both); this runs on SQLite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from rackflow.security import hash_token
from rackflow.v1 import flow_pb2 as pb
from tests.browser.page import by_testid, read, text, visible, wait
from tests.browser.test_trigger_request_id import NO_STORAGE, unscript
from tests.e2e.cluster import ServerProcess, start_server
from tests.e2e.fleet import schedule_request

pytestmark = pytest.mark.slow

VIEWER, OPERATOR = "browser-viewer-3c1f", "browser-operator-8d02"


@pytest.fixture(scope="module")
def server(served_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("tokens")
    url = served_db_url
    started = start_server(
        url,
        directory,
        args=["--http-listen", "127.0.0.1:0"],
        env={
            "RACKFLOW_AUTH_TOKEN_WALLBOARD": f"viewer:{hash_token(VIEWER)}",
            "RACKFLOW_AUTH_TOKEN_ONCALL": f"operator:{hash_token(OPERATOR)}",
        },
        name="tokens",
    )
    metadata = (("authorization", f"Bearer {OPERATOR}"),)
    stub = started.stub()
    rack = stub.CreateRack(
        pb.CreateRackRequest(
            name="t1", components=[pb.ComponentSpec(type=pb.COMPONENT_TYPE_COMPUTE, name="c0")]
        ),
        metadata=metadata,
    )
    assert rack.name == "t1"
    stub.CreateTaskSchedule(
        schedule_request("guarded", ["t1"], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h"),
        metadata=metadata,
    )
    yield started
    assert started.stop() == 0, started.output
    assert VIEWER not in started.output and OPERATOR not in started.output


def give_token(driver: WebDriver, token: str) -> None:
    visible(driver, "token-dialog")
    field = visible(driver, "token-input")
    field.clear()
    field.send_keys(token)
    visible(driver, "token-submit").click()


def test_the_page_asks_once_and_a_viewer_sees_no_action(server: ServerProcess, driver: WebDriver) -> None:
    driver.get(f"{server.http_url}/schedules")
    give_token(driver, VIEWER)
    wait(driver, lambda d: len(by_testid(d, "schedule-row")) == 1, "the schedules, read with the token")

    driver.get(f"{server.http_url}/schedules/guarded")  # a new page: the kept token is used, no question
    wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, "main h1").text == "guarded", "the schedule")
    assert not visible(driver, "live-status").get_attribute("class").endswith("stale")
    assert not [d for d in by_testid(driver, "token-dialog") if d.is_displayed()]

    # A viewer is offered no action: each would end in a 403 (tests/web/test_page_roles.py checks every page).
    actions = [
        b.get_attribute("data-testid") for b in driver.find_elements(By.CSS_SELECTOR, "button[data-post]")
    ]
    assert actions == []
    assert read(driver, lambda d: by_testid(d, "no-runs"))
    assert not by_testid(driver, "action-edit")
    # Nor any form: a form's page says the role may not write (tests/web/test_forms.py checks each).
    driver.get(f"{server.http_url}/schedules/new")
    visible(driver, "form-refused")
    assert not driver.find_elements(By.CSS_SELECTOR, "form[data-editor]")


def test_a_wrong_token_is_asked_again_and_an_operator_acts(server: ServerProcess, driver: WebDriver) -> None:
    driver.get(f"{server.http_url}/schedules/guarded")
    give_token(driver, "not-the-token")
    wait(driver, lambda d: "not valid" in text(d, "token-error"), "the token to be refused")
    give_token(driver, OPERATOR)
    wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, "main h1").text == "guarded", "the schedule")
    assert visible(driver, "action-pause")
    visible(driver, "action-trigger").click()
    visible(driver, "confirm-ok").click()
    wait(driver, lambda d: len(by_testid(d, "grid-column")) == 1, "the firing's column")
    assert text(driver, "flash") == "Triggered guarded"
    # A form's page comes in after the token too, and its preview is asked with it.
    driver.get(f"{server.http_url}/schedules/guarded/edit")
    wait(driver, lambda d: by_testid(d, "preview-decision"), "the edit form's preview")

    driver.find_element(By.ID, "forget-token").click()  # back to asking
    visible(driver, "token-dialog")


def test_with_storage_refused_a_form_previews_and_saves_with_the_token_given_on_its_page(
    server: ServerProcess, driver: WebDriver
) -> None:
    """A browser that refuses storage (a private window) keeps the token in the page's memory: the form's
    preview and its Save send it too, rather than failing on the storage they cannot read (the fixture
    fails on a script error) and leaving Save disabled with nothing said."""
    refused = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": NO_STORAGE})
    try:
        driver.get(f"{server.http_url}/schedules/guarded/edit")
        give_token(driver, OPERATOR)
        wait(driver, lambda d: by_testid(d, "preview-decision"), "the preview, asked with the token")
        field = visible(driver, "form-pause-after")
        field.clear()
        field.send_keys("3")
        visible(driver, "form-save").click()
        wait(driver, lambda d: d.current_url.endswith(tuple("0123456789abcdef")), "the saved schedule's page")
        give_token(driver, OPERATOR)  # kept in the form page's memory only: asked again on the next
        wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, "main h1").text == "guarded", "its page")
        assert text(driver, "schedule-pause-after") == "3 consecutive failing runs"
    finally:
        unscript(driver, refused)

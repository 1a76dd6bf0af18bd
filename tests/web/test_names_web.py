"""The console's forms with names that would not show as themselves: a create is refused with the name
field named (the form shows the refusal beside it, as any other), and a schedule named before the rule opens
in its form with its name as stored and is saved with it sent back unchanged, as `static/forms.js` sends
every field."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import httpx
import pytest

from rackflow import validation
from rackflow.checks.service import CheckInput
from rackflow.domain.checks import WebhookSettings
from rackflow.domain.windows import OneOff, WindowKind
from rackflow.services import Services
from rackflow.windows.service import Ref, WindowInput
from tests.conftest import table_counts
from tests.web.conftest import make_racks, make_schedule
from tests.web.test_forms import value_of
from tests.web.test_json_writes import API, CREATE_BUDGET, CREATE_SCHEDULE, CREATE_WINDOW, ok, refused

INVISIBLE = "r12\u200b"


def named(body: dict[str, Any], name: str) -> dict[str, Any]:
    ((wrapper, fields),) = ((k, v) for k, v in body.items() if k in ("schedule", "window", "budget"))
    return body | {wrapper: fields | {"name": name}}


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("schedules", CREATE_SCHEDULE, "schedule.name"),
        ("windows", CREATE_WINDOW, "window.name"),
        ("budgets", CREATE_BUDGET, "budget.name"),
    ],
)
async def test_a_form_s_create_with_an_invisible_character_is_refused_naming_the_name_field(
    http: httpx.AsyncClient, services: Services, path: str, body: dict[str, Any], field: str
) -> None:
    await make_racks(services, "r1", "r2")
    before = await table_counts(services.db)
    message = refused(
        await http.post(f"{API}/{path}", json=named(body, INVISIBLE)),
        400,
        field,
        "U+200B ZERO WIDTH SPACE at position 4 is not allowed",
    )
    assert "'r12\\u200b'" in message
    counts = await table_counts(services.db)
    assert counts.pop("audit_events") - before.pop("audit_events") <= 1  # a refused RPC is audited
    assert counts == before


async def test_a_schedule_named_before_the_rule_is_saved_by_its_form_with_its_name_unchanged(
    http: httpx.AsyncClient, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    await make_racks(services, "r1")
    with monkeypatch.context() as before_the_rule:
        before_the_rule.setattr(validation, "check_identifier", lambda value, _field: value)
        schedule = await make_schedule(services, INVISIBLE, "r1")
    form = await http.get(f"/schedules/{schedule.id}/edit")
    assert form.status_code == 200, form.text
    assert value_of(form.text, "form-name") == INVISIBLE

    edit = {"schedule": {"name": INVISIBLE, "spec": {"type": "SCHEDULE_SPEC_TYPE_INTERVAL", "spec": "6h"}}}
    saved = ok(await http.patch(f"{API}/schedules/{schedule.id}", json=edit))
    assert (saved["name"], saved["spec"]["spec"]) == (INVISIBLE, "6h")
    refused(
        await http.patch(f"{API}/schedules/{schedule.id}", json={"schedule": {"name": "r\u202e21"}}),
        400,
        "schedule.name",
        "U+202E RIGHT-TO-LEFT OVERRIDE at position 2",
    )
    assert (
        ok(await http.patch(f"{API}/schedules/{schedule.id}", json={"schedule": {"name": "r12"}}))["name"]
        == "r12"
    )


async def test_an_edit_s_preview_keeps_a_name_stored_before_the_rule_and_checks_a_new_one(
    http: httpx.AsyncClient, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The form previews (and checks) every edit before it saves it: the draft's name is checked as
    UpdateTaskSchedule checks it (`validation.check_rename`), so a schedule named before the rule can be
    previewed, and so edited, under its own name, and a rename to a name the rule refuses is refused."""
    await make_racks(services, "r1")
    with monkeypatch.context() as before_the_rule:
        before_the_rule.setattr(validation, "check_identifier", lambda value, _field: value)
        schedule = await make_schedule(services, INVISIBLE, "r1")
    target = {"racks": {"targets": [{"name": "r1"}]}}

    def preview(name: str) -> dict[str, Any]:
        spec = {"type": "SCHEDULE_SPEC_TYPE_INTERVAL", "spec": "6h"}
        operation = {"power_reset": {"target_spec": target}}
        draft = {"schedule": {"name": name, "spec": spec}, "operation": operation}
        return {"id": {"id": str(schedule.id)}, "draft": draft, "count": 1}

    firings = ok(await http.post(f"{API}/schedules:preview", json=preview(INVISIBLE)))["firings"]
    assert [s["rack_name"] for s in firings[0]["scopes"]] == ["r1"]
    refused(
        await http.post(f"{API}/schedules:preview", json=preview("r\u202e21")),
        400,
        "draft.schedule.name",
        "U+202E RIGHT-TO-LEFT OVERRIDE at position 2",
    )
    assert ok(await http.post(f"{API}/schedules:preview", json=preview("r12")))["firings"]
    # A new schedule's draft is checked as create checks it, whatever schedule bears that name.
    new = {k: v for k, v in preview(INVISIBLE).items() if k != "id"}
    refused(await http.post(f"{API}/schedules:preview", json=new), 400, "draft.schedule.name", "U+200B")


async def test_the_form_s_preview_answers_each_name_as_the_pages_write_it(
    http: httpx.AsyncClient, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`POST /previews/schedule`: the JSON API's preview of the same draft, with `shown`, each rack's and
    window's name in it escaped by `validation.shown` (a domain's racks, which the form never chose by
    name, and the window that skips one, among them); a refusal is the JSON API's."""
    now = services.clock.now()
    with monkeypatch.context() as before_the_rule:
        before_the_rule.setattr(validation, "check_identifier", lambda value, _field: value)
        racks = await make_racks(services, INVISIBLE, "r13")
        await services.inventory.create_domain("d1", racks)
        await services.windows.create(
            WindowInput(
                name="frz\u202e",
                kind=WindowKind.FREEZE,
                when=OneOff(now - timedelta(hours=1), now + timedelta(days=30)),
                racks=(Ref(name=INVISIBLE),),
            )
        )
    target = {"nvl_domains": {"targets": [{"name": "d1"}]}}
    draft = {
        "schedule": {"name": "", "spec": {"type": "SCHEDULE_SPEC_TYPE_INTERVAL", "spec": "6h"}},
        "operation": {"power_on": {"target_spec": target}},
    }
    body = {"draft": draft, "count": 1}
    answer = ok(await http.post("/previews/schedule", json=body))
    api = ok(await http.post(f"{API}/schedules:preview", json=body))
    assert answer.pop("shown") == {INVISIBLE: "r12\\u200b", "r13": "r13", "frz\u202e": "frz\\u202e"}
    for preview in answer, api:  # a new scope's id is made for each preview
        for scope in preview["firings"][0]["scopes"]:
            scope.pop("scope_id")
    assert answer == api
    scopes = {s["rack_name"]: (s["decision"], s["window_name"]) for s in api["firings"][0]["scopes"]}
    assert scopes == {INVISIBLE: ("skip_window", "frz\u202e"), "r13": ("fire", "")}

    unknown = {**body, "draft": {**draft, "operation": {"power_on": {"target_spec": {}}}}}
    field = "draft.operation.power_on.target_spec"
    refused(await http.post("/previews/schedule", json=unknown), 400, field, "no targets")
    refused(await http.post("/previews/schedule", json={"counts": 1}), 400, "counts", "unknown field")


async def test_the_list_of_checks_shows_the_racks_a_check_covers_escaped(
    http: httpx.AsyncClient, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as before_the_rule:
        before_the_rule.setattr(validation, "check_identifier", lambda value, _field: value)
        await make_racks(services, INVISIBLE)
    hook = WebhookSettings("http://127.0.0.1:9/", "", "")
    await services.checks.create(CheckInput(name="drained", racks=(Ref(name=INVISIBLE),), settings=hook))
    page = (await http.get("/windows")).text
    found = re.search(r'<tr data-testid="check-row" data-name="drained">(.*?)</tr>', page, re.S)
    assert found is not None and "<td>r12\\u200b</td>" in found.group(1), page
    assert "\u200b" not in found.group(1)

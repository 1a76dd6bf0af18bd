"""The forms that create and edit schedules, windows and budgets (`static/forms.js` drives them; the
browser tests in tests/browser/test_forms.py run them): each page is offered to a role that may write, filled
in with what is saved when editing, and to a viewer shows no form and no link or button to one."""

from __future__ import annotations

import re
from datetime import timedelta

import httpx
import pytest

from rackflow.domain.approvals import ApprovalPolicy
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.security import TokenTable
from rackflow.services import Services
from rackflow.store import paging
from rackflow.web.pages import schedules as schedules_page
from tests.api.secured import OPERATOR_TOKEN, TOKENS, VIEWER_TOKEN
from tests.web.conftest import make_racks, make_schedule
from tests.web.test_pages import FRAGMENT, tagged

FORM_LINKS = (
    "new-schedule",
    "action-edit",
    "action-delete",
    "new-window",
    "window-edit",
    "window-delete",
    "new-budget",
    "budget-edit",
    "budget-delete",
)


@pytest.fixture
def tokens() -> TokenTable | None:
    return TOKENS


def value_of(html: str, testid: str) -> str:
    (tag,) = tagged(html, testid)
    found = re.search(r'value="([^"]*)"', tag)
    return found.group(1) if found else ""


async def fleet(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1", "r2", "r3")
    await make_schedule(
        services,
        "nightly",
        "r1",
        "r2",
        rollout=RolloutPolicy(max_concurrent_racks=1),
        approval=ApprovalPolicy(timedelta(hours=4), min_approvers=2),
    )
    headers = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    window = {
        "window": {
            "name": "sat",
            "kind": "WINDOW_KIND_ALLOW",
            "racks": [{"name": "r3"}],
            "recurring": {"cron": "0 22 * * 6", "duration": "6h", "timezone": "Europe/Berlin"},
        }
    }
    budget = {"budget": {"name": "fw", "operations": ["upgrade_firmware"], "max_running": 4}}
    for path, body in (("/api/v1/windows", window), ("/api/v1/budgets", budget)):
        response = await http.post(path, json=body, headers=headers)
        assert response.status_code == 200, response.text


async def page(http: httpx.AsyncClient, path: str, token: str) -> str:
    response = await http.get(path, headers={"Authorization": f"Bearer {token}", **FRAGMENT})
    assert response.status_code == 200, response.text
    return response.text


async def test_an_operator_gets_each_form_filled_in_with_what_is_saved(
    http: httpx.AsyncClient, services: Services
) -> None:
    await fleet(http, services)
    new = await page(http, "/schedules/new", OPERATOR_TOKEN)
    assert tagged(new, "schedule-form") and not tagged(new, "form-refused")
    assert tagged(new, "scope-pick")  # racks are added by name, the picker asking for a few (below)
    assert 'value="Europe/Berlin"' in new  # the zones suggested
    assert 'value="COMPONENT_TYPE_COMPUTE"' in new
    assert "checked" not in tagged(new, "form-approval-on")[0]  # no approval unless asked for
    edit = await page(http, "/schedules/nightly/edit", OPERATOR_TOKEN)
    assert value_of(edit, "form-name") == "nightly"
    assert re.findall(r'<li data-name="([^"]+)"', edit) == ["r1", "r2"]  # its racks, each removable
    assert value_of(edit, "form-rollout-max_concurrent_racks") == "1"
    assert "checked" in tagged(edit, "form-approval-on")[0]
    assert value_of(edit, "form-approval-timeout") == "4h"
    assert value_of(edit, "form-approval-min_approvers") == "2"
    assert "disabled" in tagged(edit, "form-operation")[0]  # an operation cannot be changed
    window = await page(http, "/windows/sat/edit", OPERATOR_TOKEN)
    assert value_of(window, "form-cron") == "0 22 * * 6" and value_of(window, "form-racks") == "r3"
    assert value_of(window, "form-timezone") == "Europe/Berlin"
    assert 'data-method="PATCH"' in window
    budget = await page(http, "/budgets/fw/edit", OPERATOR_TOKEN)
    assert (
        value_of(budget, "form-max-running") == "4"
        and "checked" in tagged(budget, "form-op-upgrade_firmware")[0]
    )
    for path in ("/windows/new", "/budgets/new"):
        assert 'data-method="POST"' in await page(http, path, OPERATOR_TOKEN)
    shown = set()
    for path in ("/schedules", "/schedules/nightly", "/windows"):
        html = await page(http, path, OPERATOR_TOKEN)
        shown |= {link for link in FORM_LINKS if tagged(html, link)}
    assert shown == set(FORM_LINKS)
    # nightly's approval policy is the approver role's to delete with it (tests/web/test_page_roles.py).
    await make_schedule(services, "plain", "r3")
    delete = tagged(await page(http, "/schedules/plain", OPERATOR_TOKEN), "action-delete")[0]
    assert 'data-method="DELETE"' in delete and 'data-then="/schedules"' in delete


async def test_the_schedule_form_holds_no_rack_list_and_its_picker_asks_for_a_few_names(
    http: httpx.AsyncClient, services: Services
) -> None:
    """A real fleet's form offered every rack and domain in two `<select>`s (20,000 of each: 1.27 MB,
    1.2 s; docs/PERFORMANCE.md, "The schedule form's racks"): the page holds no name but those of the
    edited schedule's racks, and its picker asks `/names/{kind}` for at most 20 that hold what is typed,
    whatever its case, the name typed in full first, then the others by name."""
    made = [(await services.inventory.create_rack(f"gb-{i:04}")).id for i in range(300)]
    for i, rack_id in enumerate(made[:40]):
        await services.inventory.create_domain(f"nvl-{i:04}", [rack_id])
    for name in ("x1", *(f"ax1-{i:02}" for i in range(25))):
        await services.inventory.create_rack(name)
    await make_schedule(services, "nightly", "gb-0123", "gb-0007")
    new = await page(http, "/schedules/new", OPERATOR_TOKEN)
    assert re.findall(r"gb-\d+|nvl-\d+|ax1", new) == []
    edit = await page(http, "/schedules/nightly/edit", OPERATOR_TOKEN)
    assert re.findall(r'<li data-name="([^"]+)"', edit) == ["gb-0007", "gb-0123"]  # its racks, removable
    assert set(re.findall(r"gb-\d+|nvl-\d+", edit)) == {"gb-0007", "gb-0123"}

    async def names(kind: str, contains: str, token: str = VIEWER_TOKEN) -> list[str]:
        answer = await http.get(
            f"/names/{kind}", params={"contains": contains}, headers={"Authorization": f"Bearer {token}"}
        )
        assert answer.status_code == 200, answer.text
        found: list[str] = answer.json()["names"]
        return found

    assert await names("racks", "GB-01") == [f"gb-{i:04}" for i in range(100, 120)]
    assert await names("racks", "x1") == ["x1", *(f"ax1-{i:02}" for i in range(19))]
    assert await names("racks", "gb-0299", OPERATOR_TOKEN) == ["gb-0299"]
    assert await names("racks", "%") == []  # taken literally
    assert await names("nvl_domains", "NVL-003") == [f"nvl-{i:04}" for i in range(30, 40)]
    assert await names("nvl_domains", "gb-") == []


async def test_the_picker_pages_a_short_text_on_from_where_its_walk_stopped(
    http: httpx.AsyncClient, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A text of one or two characters looks through SEARCH_WALK names a request (here 3, by name), where a
    rare one read every name: the answer may hold fewer than 20 names, or none, and name where to ask on
    (`after`, with the walk's size); asking on after it, page by page, gives every name that holds the text
    once, in name order, and only the last answer says there is no more (`after` null). The name typed in
    full comes first, on the first page only."""
    monkeypatch.setattr(paging, "SEARCH_WALK", 3)
    monkeypatch.setattr(schedules_page, "SEARCH_WALK", 3)
    for name in ("a-1", "b-1", "c-1", "d-1", "e-1", "f-1", "g-qx", "h-1", "qx"):
        await services.inventory.create_rack(name)
    pages: list[list[str]] = []
    after = ""
    while True:
        answer = await http.get(
            "/names/racks",
            params={"contains": "qx", "after": after},
            headers={"Authorization": f"Bearer {VIEWER_TOKEN}"},
        )
        assert answer.status_code == 200, answer.text
        data = answer.json()
        pages.append(data["names"])
        assert data["shown"] == data["names"] and data["walk"] == 3
        if data["after"] is None:
            break
        after = data["after"]
        assert len(pages) <= 9
    # qx, typed in full, then the walks: a-1 b-1 c-1 | d-1 e-1 f-1 | g-qx h-1 qx (itself left out), the end
    assert pages == [["qx"], [], ["g-qx"]]
    longer = await http.get(
        "/names/racks", params={"contains": "-qx"}, headers={"Authorization": f"Bearer {VIEWER_TOKEN}"}
    )
    assert longer.json() == {"names": ["g-qx"], "shown": ["g-qx"], "after": None, "walk": None}  # not walked


@pytest.mark.parametrize(
    ("path", "token", "status", "code", "field"),
    [
        ("/names/racks?contains=", VIEWER_TOKEN, 400, "INVALID_ARGUMENT", "contains"),
        ("/names/racks", VIEWER_TOKEN, 400, "INVALID_ARGUMENT", "contains"),
        ("/names/racks?contains=a%00", VIEWER_TOKEN, 400, "INVALID_ARGUMENT", "contains"),
        ("/names/racks?contains=a&after=a%00", VIEWER_TOKEN, 400, "INVALID_ARGUMENT", "after"),
        (f"/names/racks?contains=a&after={'a' * 256}", VIEWER_TOKEN, 400, "INVALID_ARGUMENT", "after"),
        (f"/names/racks?contains={'a' * 256}", VIEWER_TOKEN, 400, "INVALID_ARGUMENT", "contains"),
        ("/names/schedules?contains=a", VIEWER_TOKEN, 404, "NOT_FOUND", "kind"),
        ("/names/racks?contains=a", "", 401, "UNAUTHENTICATED", None),
        ("/names/racks?contains=a", "wrong", 401, "UNAUTHENTICATED", None),
    ],
)
async def test_the_picker_refuses_what_it_cannot_answer(
    http: httpx.AsyncClient, path: str, token: str, status: int, code: str, field: str | None
) -> None:
    answer = await http.get(path, headers={"Authorization": f"Bearer {token}"} if token else {})
    assert (answer.status_code, answer.json()["code"], answer.json()["field"]) == (status, code, field)


async def test_a_viewer_sees_no_form_and_no_way_to_one(http: httpx.AsyncClient, services: Services) -> None:
    await fleet(http, services)
    for path in (
        "/schedules/new",
        "/schedules/nightly/edit",
        "/windows/new",
        "/windows/sat/edit",
        "/budgets/new",
        "/budgets/fw/edit",
    ):
        html = await page(http, path, VIEWER_TOKEN)
        assert tagged(html, "form-refused") and "<form" not in html, path
    for path in ("/schedules", "/schedules/nightly", "/windows"):
        html = await page(http, path, VIEWER_TOKEN)
        assert not [link for link in FORM_LINKS if tagged(html, link)], path


async def test_a_form_for_what_does_not_exist_is_a_404(http: httpx.AsyncClient, services: Services) -> None:
    for path in ("/schedules/gone/edit", "/windows/gone/edit", "/budgets/gone/edit"):
        response = await http.get(path, headers={"Authorization": f"Bearer {OPERATOR_TOKEN}", **FRAGMENT})
        assert response.status_code == 404, path

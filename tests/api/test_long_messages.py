"""An error that quotes a huge bad value still reaches the client as its code, naming the field.

A message quotes the value it refuses (`operation_type: 'x…' is not an operation (…)`), and gRPC carries
the message in a trailer, which a client refuses past its metadata limit (8 KiB soft, 16 KiB hard, after
percent-encoding every non-ASCII byte as three characters): the client then saw RESOURCE_EXHAUSTED
"Stream removed", not the INVALID_ARGUMENT that was sent, and not which field was wrong.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import grpc
import pytest
from google.protobuf.message import Message

from rackflow.api.errors import MAX_MESSAGE_BYTES, message_of
from rackflow.errors import InvalidArgument
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1 import flow_pb2_grpc
from rackflow.web.calls import RpcError

HUGE = (
    ("ascii", "y" * 100_000),
    # 3,000 characters, 6,000 bytes, 18,000 characters once percent-encoded: past the hard limit.
    ("non-ascii", "é" * 3_000),
)
# (rpc, the field its message starts with, the end of its message, the request with `value`).
ECHOING: list[tuple[str, str, str, Callable[[str], Message]]] = [
    (
        "ListTaskSchedules",
        "operation_type",
        "upgrade_firmware)",
        lambda v: pb.ListTaskSchedulesRequest(operation_type=v),
    ),
    ("ListTaskSchedules", "order_by", "", lambda v: pb.ListTaskSchedulesRequest(order_by=v)),
    (
        "ListAuditEvents",
        "method",
        "is not an RPC of the Flow service",
        lambda v: pb.ListAuditEventsRequest(method=v),
    ),
    (
        "ListNotificationDeliveries",
        "states[0]",
        "(one of pending, delivered, dead)",
        lambda v: pb.ListNotificationDeliveriesRequest(states=[v]),
    ),
    (
        "CreateOperationBudget",
        "budget.operations[0]",
        "",
        lambda v: pb.CreateOperationBudgetRequest(budget=pb.OperationBudget(name="b", operations=[v])),
    ),
]


@pytest.mark.parametrize(("kind", "value"), HUGE, ids=[k for k, _ in HUGE])
@pytest.mark.parametrize(
    ("rpc", "field", "ending", "make"), ECHOING, ids=[f"{r}-{f}" for r, f, _, _ in ECHOING]
)
async def test_a_refusal_quoting_a_huge_value_arrives_as_invalid_argument_naming_the_field(
    rpc: str,
    field: str,
    ending: str,
    make: Callable[[str], Message],
    kind: str,
    value: str,
    stub: flow_pb2_grpc.FlowStub,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await getattr(stub, rpc)(make(value), timeout=10)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    details = info.value.details() or ""
    assert details.startswith(f"{field}: ")
    assert details.endswith(ending)
    assert "characters left out" in details
    assert len(details.encode()) <= MAX_MESSAGE_BYTES


def test_a_message_within_the_bound_is_kept_whole_and_the_json_api_bounds_the_same() -> None:
    short = InvalidArgument("name: must not be empty")
    assert message_of(short) == "name: must not be empty"
    long = InvalidArgument(f"order_by: {'y' * 50_000!r} is not one of created_at, name")
    assert RpcError.of(long).message == message_of(long)
    assert RpcError.of(long).message.endswith("is not one of created_at, name")
    assert len(message_of(long).encode()) <= MAX_MESSAGE_BYTES


async def test_an_answer_past_the_message_limit_is_refused_saying_how_to_ask_for_less(
    stub: flow_pb2_grpc.FlowStub, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """gRPC alone answers "Sent message larger than max (N vs. M)" to a ListRacks with no limit over a
    fleet of racks of 36 components (about 95 MB at 20,000): the refusal names the RPC and the way out."""
    for index in range(10):
        await stub.CreateRack(pb.CreateRackRequest(name=f"rack-with-a-long-name-{index:02}"))
    a_page = pb.ListRacksRequest(pagination=pb.Pagination(limit=1))
    one = await stub.ListRacks(a_page)
    whole = await stub.ListRacks(pb.ListRacksRequest())
    assert one.ByteSize() < whole.ByteSize()
    monkeypatch.setattr("rackflow.api.errors.GRPC_MESSAGE_BYTES", one.ByteSize())

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.ListRacks(pb.ListRacksRequest())

    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert re.match(
        r"ListRacks's answer is [\d.]+ MiB, past the \d+ MiB a gRPC message", refused.value.details()
    )
    assert "pagination.limit" in refused.value.details()
    assert "refused to send an answer: ListRacks's answer" in caplog.text
    assert len((await stub.ListRacks(a_page)).racks) == 1

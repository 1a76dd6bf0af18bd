"""Rollout and retry policy messages to domain values and back: apart from the rest of the schedule's
conversion, because the CLI describes these policies too (`RolloutPolicy.describe`), and a client command
must not import the server's services and database layer to start (about a second of every command).
"""

from __future__ import annotations

from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.tasks import RetryPolicy
from rackflow.timespec import format_go_duration
from rackflow.v1 import flow_pb2 as pb
from rackflow.validation import bake_time, check_rollout, retry_from


def rollout_from(msg: pb.RolloutPolicy, field: str = "schedule.rollout") -> RolloutPolicy:
    """The policy, checked (`validation.check_rollout`); an unset `pause_on_halt` means true."""
    return check_rollout(rollout_of(msg, field), field)


def rollout_of(msg: pb.RolloutPolicy, field: str = "schedule.rollout") -> RolloutPolicy:
    """The policy as given, unchecked: for showing one the server stored, which may predate a rule
    (`rollout_from` checks a policy to store)."""
    return RolloutPolicy(
        max_concurrent_racks=msg.max_concurrent_racks,
        max_per_domain=msg.max_per_domain,
        canary_racks=msg.canary_racks,
        bake_time=bake_time(msg.bake_time, f"{field}.bake_time"),
        halt_after_failures=msg.halt_after_failures,
        halt_after_failure_percent=msg.halt_after_failure_percent,
        pause_on_halt=msg.pause_on_halt if msg.HasField("pause_on_halt") else True,
    )


def rollout_to(policy: RolloutPolicy | None) -> pb.RolloutPolicy | None:
    if policy is None:
        return None
    return pb.RolloutPolicy(
        max_concurrent_racks=policy.max_concurrent_racks,
        max_per_domain=policy.max_per_domain,
        canary_racks=policy.canary_racks,
        bake_time=format_go_duration(policy.bake_time) if policy.bake_time else "",
        halt_after_failures=policy.halt_after_failures,
        halt_after_failure_percent=policy.halt_after_failure_percent,
        pause_on_halt=policy.pause_on_halt,
    )


def retry_policy_from(msg: pb.RetryPolicy, field: str = "schedule.retry") -> RetryPolicy:
    """The policy, defaults applied and checked (`validation.retry_from`)."""
    return retry_from(msg.max_attempts, msg.initial_backoff, msg.multiplier, msg.max_backoff, field)


def retry_policy_to(policy: RetryPolicy | None) -> pb.RetryPolicy | None:
    if policy is None:
        return None
    return pb.RetryPolicy(
        max_attempts=policy.max_attempts,
        initial_backoff=format_go_duration(policy.initial_backoff),
        multiplier=policy.multiplier,
        max_backoff=format_go_duration(policy.max_backoff),
    )

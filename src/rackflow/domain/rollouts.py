"""The rollout rule, as one pure function: given a run's scopes in order and where each stands, which may
start now, and whether the run must halt (or, its firmware window over, be cancelled).

No I/O and no clock: the caller passes `now` and the scopes' states as read from the database, so the rule
is the same on every instance and after any restart (nothing lives in memory between two decisions).

The rule, in order:

1. Failures count from the last resume (`failures_excused` are the ones before it). While scopes still
   wait to start (pending, or submitted with a task that has not begun: held by a budget, a freeze, a
   pre-flight check, its window's opening, or not claimed yet) and the count reaches
   `halt_after_failures`, or `halt_after_failure_percent` of all scopes, the run halts: nothing more
   starts (the halt holds those tasks; tasks already running finish). A run whose caps let every rack be
   submitted at once has no scope pending, but a budget may hold most of its tasks: they wait all the
   same, and a failure limit reached meanwhile must stop them. Once every scope has begun there is
   nothing left to stop: a run that ends over its limit completes, but says so (`over_limit`), and its
   schedule is paused as a halt would pause it, so that its next firing does not roll the same change out
   again unlooked-at.
2. Canaries (the first `canary_racks` scopes) go first and alone. A failed canary halts the run; the rest
   start only once every canary ended and none failed, and `bake_time` after the last canary finished.
   A resumed run has passed its canary gate (the operator looked and said go).
0. Before the above: once its operation's own window has ended (`window_end`: a firmware upgrade's
   end_time, the window half-open) while scopes still wait to start, the run is cancelled by rackflow
   (`window_ended_cancel`): a wave started then would only fail unrun at its claim, and nothing can move
   the end, so a halt could only wait for an operator's cancel (a resume is refused past the end,
   `RolloutService.resume`). Tasks already running finish, as after any cancel.
3. Caps: at most `max_concurrent_racks` scopes active at once, at most `max_per_domain` active in one
   NVLink domain (a rack without a domain counts as a domain of its own). Scopes start in their order;
   one held back by its domain's cap does not hold back later scopes of other domains.
"""

from __future__ import annotations

import enum
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from rackflow.timespec import format_go_duration, format_rfc3339


def bakes_without_canaries(canary_racks: int, bakes: bool) -> bool:
    """The bake is the wait after the canaries (`decide`), so a policy that bakes without any would do
    nothing, while the operator believes the rollout pauses after its first racks: the API refuses it
    (`validation.check_rollout`) and the CLI names its flags (`cli.rollouts.policy_from`). A schedule
    stored before that keeps it until its rollout is updated; its firings simply do not bake."""
    return bakes and not canary_racks


@dataclass(frozen=True)
class RolloutPolicy:
    """How a schedule's firing rolls out. A zero means "no limit" (or no canaries, no bake)."""

    max_concurrent_racks: int = 0
    max_per_domain: int = 0
    canary_racks: int = 0
    bake_time: timedelta = timedelta(0)
    halt_after_failures: int = 0
    halt_after_failure_percent: float = 0.0
    pause_on_halt: bool = True

    def describe(self) -> str:
        """For people: `max 5, 1 per domain, 2 canaries, bake 15m, halt after 2, pause on halt`."""
        parts = []
        if self.max_concurrent_racks:
            parts.append(f"max {self.max_concurrent_racks}")
        if self.max_per_domain:
            parts.append(f"{self.max_per_domain} per domain")
        if self.canary_racks:
            parts.append(f"{self.canary_racks} canar{'y' if self.canary_racks == 1 else 'ies'}")
        if self.bake_time:
            parts.append(f"bake {format_go_duration(self.bake_time)}")
        if self.halt_after_failures:
            parts.append(f"halt after {self.halt_after_failures}")
        if self.halt_after_failure_percent:
            parts.append(f"halt after {self.halt_after_failure_percent:g}%")
        parts.append("pause on halt" if self.pause_on_halt else "keep firing on halt")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "max_concurrent_racks": self.max_concurrent_racks,
            "max_per_domain": self.max_per_domain,
            "canary_racks": self.canary_racks,
            "bake_seconds": self.bake_time.total_seconds(),
            "halt_after_failures": self.halt_after_failures,
            "halt_after_failure_percent": self.halt_after_failure_percent,
            "pause_on_halt": self.pause_on_halt,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RolloutPolicy:
        return cls(
            max_concurrent_racks=int(data["max_concurrent_racks"]),
            max_per_domain=int(data["max_per_domain"]),
            canary_racks=int(data["canary_racks"]),
            bake_time=timedelta(seconds=float(data["bake_seconds"])),
            halt_after_failures=int(data["halt_after_failures"]),
            halt_after_failure_percent=float(data["halt_after_failure_percent"]),
            pause_on_halt=bool(data["pause_on_halt"]),
        )


@dataclass(frozen=True)
class RackPlace:
    """A rack's name (rollout order and reasons) and NVLink domain (the per-domain cap)."""

    name: str
    domain_id: uuid.UUID | None


class Phase(enum.StrEnum):
    """Where one scope of a rollout stands."""

    PENDING = "pending"  # waiting its turn
    ACTIVE = "active"  # its task is waiting, pending or running
    # Its task is held by a pre-flight check (docs/CHECKS.md): not running against the caps, and not failed
    # unless a check gives up (then the task fails).
    HELD = "held"
    SUCCEEDED = "succeeded"  # its task completed
    FAILED = "failed"  # its task failed or was terminated, or it could not be submitted
    # Settled without a task (overlap, a closed window, or an opening past the start deadline): neither
    # success nor failure.
    SKIPPED = "skipped"
    NOT_STARTED = "not_started"  # halted or cancelled before its turn


ENDED = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.SKIPPED, Phase.NOT_STARTED})


@dataclass(frozen=True)
class ScopeView:
    """One scope as the rule sees it. `finished_at`: when its task ended (bake time counts from it).
    `unbegun`: an ACTIVE scope whose task has not begun (its first attempt, PENDING or WAITING): it still
    waits to start, so a halt would hold it."""

    scope_id: uuid.UUID
    rack_id: uuid.UUID
    label: str
    domain_id: uuid.UUID | None
    phase: Phase
    canary: bool = False
    finished_at: datetime | None = None
    unbegun: bool = False


@dataclass(frozen=True)
class Decision:
    """What to do now: `start` these scopes (in order), or `halt` with this reason, or `cancel` the run with
    this reason (rule 0: nothing could resume it). `done`: every scope reached an end; `over_limit`: why,
    done, it is over its failure limit, which no halt could act on (every rack had begun), but which
    pauses its schedule as a halt would. `bake_until`: the rest wait for the canaries' bake time until
    then."""

    start: tuple[uuid.UUID, ...] = ()
    halt: str | None = None
    cancel: str | None = None
    done: bool = False
    over_limit: str | None = None
    bake_until: datetime | None = None

    @property
    def pause_reason(self) -> str | None:
        """Why this step pauses the run's schedule (its policy's `pause_on_halt` allowing): a halt, a
        cancel at its window's end, or a run done over its failure limit."""
        return self.halt or self.cancel or self.over_limit


def failures_counted(scopes: Sequence[ScopeView], failures_excused: int) -> int:
    return max(0, sum(s.phase is Phase.FAILED for s in scopes) - failures_excused)


def halt_reason(policy: RolloutPolicy, scopes: Sequence[ScopeView], failures_excused: int) -> str | None:
    """Why the failure budget stops the run, or None while it holds."""
    return limit_reached(policy, failures_counted(scopes, failures_excused), len(scopes))


def limit_reached(policy: RolloutPolicy, failures: int, total: int) -> str | None:
    """Why `failures` counted (since the last resume) of `total` scopes reach the failure limit, or None.
    Monotone in `failures`: the rollout gate asks it with an upper bound of them, to skip the rule for a
    run that cannot be halting (`rollouts.gate.failures_at_most`)."""
    over = _over_limit(policy, failures, total)
    return f"rollout halted: {over}" if over else None


def _over_limit(policy: RolloutPolicy, failures: int, total: int) -> str:
    """How `failures` of `total` reach the policy's limit (`2 of 40 racks failed (limit 2)`), or "" when
    they do not."""
    if policy.halt_after_failures and failures >= policy.halt_after_failures:
        return f"{failures} of {total} racks failed (limit {policy.halt_after_failures})"
    percent = policy.halt_after_failure_percent
    if percent and failures and failures * 100 >= percent * total:
        return f"{failures} of {total} racks failed (limit {percent:g}%)"
    return ""


def caps_reached(policy: RolloutPolicy, active: int, in_domain: int) -> str:
    """Why one more scope may not start now beside `active` ones, `in_domain` of them in its domain (a rack
    without a domain is a domain of its own), or "" when the caps leave room: the rollout gate counts them
    in SQL rather than list them. For a scope its pre-flight checks held: held, it did not count, so the
    rollout may have filled its place."""
    if policy.max_concurrent_racks and active >= policy.max_concurrent_racks:
        return f"{active} of its racks active (max {policy.max_concurrent_racks})"
    if policy.max_per_domain and in_domain >= policy.max_per_domain:
        return (
            f"{in_domain} of its racks active in this rack's domain (max {policy.max_per_domain} per domain)"
        )
    return ""


def window_ended_cancel(end: datetime) -> str:
    """Why rackflow cancels a rollout once its operation's own window (a firmware upgrade's end_time) has
    ended with scopes still to start (rule 0)."""
    return (
        f"rollout cancelled by rackflow: its firmware window ended at {format_rfc3339(end)} (its upgrade's "
        "end_time): no wave starts at or after it, as each of its tasks would fail unrun, and no resume "
        "could move the end; create a new schedule with a later end_time for its racks not started"
    )


def decide(
    policy: RolloutPolicy,
    scopes: Sequence[ScopeView],
    *,
    now: datetime,
    failures_excused: int = 0,
    resumed: bool = False,
    window_end: datetime | None = None,
) -> Decision:
    """The rule above, for `scopes` in rollout order (canaries first); `window_end`: the end of its
    operation's own window (None: it has none)."""
    pending = [s for s in scopes if s.phase is Phase.PENDING]
    active = [s for s in scopes if s.phase is Phase.ACTIVE]
    waiting = pending or any(s.phase is Phase.HELD or s.unbegun for s in scopes)
    if not waiting:
        if active:
            return Decision()
        over = _over_limit(policy, failures_counted(scopes, failures_excused), len(scopes))
        return Decision(
            done=True, over_limit=f"rollout completed over its failure limit: {over}" if over else None
        )
    if window_end is not None and now >= window_end:
        return Decision(cancel=window_ended_cancel(window_end))
    reason = halt_reason(policy, scopes, failures_excused)
    if reason is not None:
        return Decision(halt=reason)
    if not pending:
        return Decision()
    eligible = pending
    bake_until = None
    canaries = [s for s in scopes if s.canary]
    if canaries and not resumed:
        failed = [s for s in canaries if s.phase is Phase.FAILED]
        if failed:
            return Decision(halt=f"rollout halted: canary {failed[0].label} failed")
        if any(s.phase not in ENDED for s in canaries):
            eligible = [s for s in pending if s.canary]
        elif policy.bake_time:
            ends = [s.finished_at for s in canaries if s.finished_at is not None]
            bake_until = max(ends) + policy.bake_time if ends else None
            if bake_until is not None and now < bake_until:
                return Decision(bake_until=bake_until)
    return Decision(start=_within_caps(policy, eligible, active), bake_until=bake_until)


def _domain(scope: ScopeView) -> tuple[str, uuid.UUID]:
    return ("domain", scope.domain_id) if scope.domain_id is not None else ("rack", scope.rack_id)


def _within_caps(
    policy: RolloutPolicy, eligible: Sequence[ScopeView], active: Sequence[ScopeView]
) -> tuple[uuid.UUID, ...]:
    room = policy.max_concurrent_racks - len(active) if policy.max_concurrent_racks else len(eligible)
    per_domain = Counter(_domain(s) for s in active)
    started: list[uuid.UUID] = []
    for scope in eligible:
        if room <= 0:
            break
        key = _domain(scope)
        if policy.max_per_domain and per_domain[key] >= policy.max_per_domain:
            continue
        started.append(scope.scope_id)
        per_domain[key] += 1
        room -= 1
    return tuple(started)

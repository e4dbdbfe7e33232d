"""Five-field cron expressions (minute hour day-of-month month day-of-week) and their next fire
time in a time zone. Pure: no I/O, no clock.

Why it works this way: docs/architecture/tasks.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week")
_BOUNDS = {"minute": (0, 59), "hour": (0, 23), "day-of-month": (1, 31), "month": (1, 12), "day-of-week": (0, 7)}
_NAMES = {
    "month": {
        m: i
        for i, m in enumerate(
            ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"], start=1
        )
    },
    "day-of-week": {d: i for i, d in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])},
}
# The longest days any month has (February: 29), to refuse day-of-month/month pairs that never occur.
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
# Feb 29 on a given weekday recurs within 28 years; searching longer can find nothing new.
_SEARCH_DAYS = 366 * 29
# The widest DST shift any zone has had is 2 hours; walking back this far from `after` finds a
# second pass of a repeated hour that lies after it in real time.
_LOOK_BACK = timedelta(hours=3)


@dataclass(frozen=True, slots=True)
class Cron:
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    # 0 = Sunday .. 6 = Saturday.
    weekdays: frozenset[int]
    any_day: bool
    any_weekday: bool
    hour_star: bool

    def day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            # One of them is `*`: the other one decides (both `*`: every day).
            return in_month and in_week
        return in_month or in_week

    def matches(self, moment: datetime) -> bool:
        """Whether a naive local wall time is one of the expression's minutes."""
        return moment.minute in self.minutes and moment.hour in self.hours and self.day_matches(moment.date())


def _number(field: str, text: str) -> int:
    names = _NAMES.get(field, {})
    if text.upper() in names:
        return names[text.upper()]
    if not text.isdigit():
        raise ValueError(f"{field}: {text!r} is not a number" + (f" or a name ({', '.join(names)})" if names else ""))
    value = int(text)
    low, high = _BOUNDS[field]
    if not low <= value <= high:
        raise ValueError(f"{field}: {value} is out of range {low}-{high}")
    return value


def _field(field: str, text: str) -> set[int]:
    low, high = _BOUNDS[field]
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise ValueError(f"{field}: empty item in {text!r}")
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise ValueError(f"{field}: step {step_text!r} must be a positive number")
            step = int(step_text)
        if base == "*":
            first, last = low, high
        elif "-" in base:
            start, _, end = base.partition("-")
            first, last = _number(field, start), _number(field, end)
            if first > last:
                raise ValueError(f"{field}: range {base!r} runs backwards")
        else:
            first = _number(field, base)
            # `5/15` means from 5 to the end in steps of 15, as in most crons.
            last = high if slash else first
        values.update(range(first, last + 1, step))
    return values


def parse(expr: str) -> Cron:
    """Parses a five-field expression; a ValueError names the field that is wrong."""
    parts = expr.split()
    if len(parts) != len(FIELDS):
        raise ValueError(
            f"cron: expected 5 fields (minute hour day-of-month month day-of-week), got {len(parts)} in {expr!r}"
        )
    minute, hour, day, month, weekday = (_field(f, p) for f, p in zip(FIELDS, parts, strict=True))
    weekdays = frozenset(d % 7 for d in weekday)
    any_day, any_weekday = parts[2].startswith("*"), parts[4].startswith("*")
    # With a restricted day-of-week any month is reachable through it (the fields are OR-ed);
    # otherwise the day-of-month alone must occur in one of the months.
    if any_weekday and not any(d <= _MONTH_DAYS[m - 1] for m in month for d in day):
        raise ValueError(f"day-of-month: {parts[2]!r} never occurs in month {parts[3]!r}")
    return Cron(
        minutes=tuple(sorted(minute)),
        hours=tuple(sorted(hour)),
        days=frozenset(day),
        months=frozenset(month),
        weekdays=weekdays,
        any_day=any_day,
        any_weekday=any_weekday,
        hour_star=parts[1].startswith("*"),
    )


def _instants(cron: Cron, wall: datetime, tz: ZoneInfo) -> tuple[list[datetime], bool]:
    """The real instants (in UTC) a matching wall time fires at, and whether it lies in a DST gap.

    UTC because datetimes sharing a tzinfo compare by wall time, ignoring fold (PEP 495): the two
    passes of a repeated hour would compare equal.
    """
    first = wall.replace(tzinfo=tz, fold=0)
    second = wall.replace(tzinfo=tz, fold=1)
    if first.utcoffset() == second.utcoffset():
        return [first.astimezone(UTC)], False
    # PEP 495: for a repeated wall time fold=0 is the earlier instant; for a skipped one fold=0
    # uses the offset from before the jump, which lands as much later as the clocks moved.
    round_trip = first.astimezone(UTC).astimezone(tz).replace(tzinfo=None)
    if round_trip == wall:
        return [first.astimezone(UTC), *([second.astimezone(UTC)] if cron.hour_star else [])], False
    return ([] if cron.hour_star else [first.astimezone(UTC)]), True


def next_fire(expr: str | Cron, after: datetime, tz: ZoneInfo) -> datetime:
    """The first fire time strictly after `after` (an aware datetime), in `tz`, as a UTC datetime.

    Raises ValueError for an expression that does not parse or that never fires.
    """
    cron = parse(expr) if isinstance(expr, str) else expr
    if after.tzinfo is None:
        raise ValueError("after must be timezone-aware")
    after = after.astimezone(UTC)
    start = (after.astimezone(tz) - _LOOK_BACK).replace(tzinfo=None, second=0, microsecond=0)
    best: datetime | None = None
    day = start.date()
    for _ in range(_SEARCH_DAYS):
        if cron.day_matches(day):
            for hour in cron.hours:
                for minute in cron.minutes:
                    wall = datetime(day.year, day.month, day.day, hour, minute)
                    if wall < start:
                        continue
                    instants, in_gap = _instants(cron, wall, tz)
                    later = [i for i in instants if i > after]
                    if later:
                        candidate = min(later)
                        best = candidate if best is None else min(best, candidate)
                        # Wall times after this one that exist fire later in real time; a
                        # skipped one shifted forward may not, so only an existing one ends it.
                        if not in_gap:
                            return best
        day += timedelta(days=1)
    if best is not None:
        return best
    raise ValueError(f"cron: {expr!r} never fires")

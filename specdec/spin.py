"""Spin before sleeping: an event loop that polls instead of sleeping when an event is due within a moment.

A process that sleeps in epoll through a 30 ms forward and is then woken by a socket pays the wake-up of
an idle CPU: on a virtual machine whose idle vCPUs halt (`cpuidle haltpoll` with no guest polling, as
here) that is ≈ 0.1-0.2 ms per wake, and a round has two (the target waking for the request, the
orchestrator for the answer). Kernel busy polling (`net.core.busy_poll`) does not apply to loopback or
to most virtual NICs, so the loop does it itself, only when told an event is expected:

* `expect(start, end)`: poll without sleeping from `start` until `end` (time.monotonic()) or until an event
  arrives; before `start` the loop sleeps as usual. A caller opens a window where an event is due at once
  and ends it when the event comes.
* `SPECDEC_SPIN_US` (ServerConfig.spin_us) bounds every window; 0 turns spinning off (windows are
  ignored). Spinning costs the CPU it runs on for at most that long per window, so it pays where a
  core would otherwise idle (a 1-thread target on a 2-core box) and is a loss where the forward needs
  every core: `auto_spin_us`.

Pure asyncio: a selectors.EpollSelector subclass behind asyncio.SelectorEventLoop (`new_loop`), so
grpc.aio, which wakes the loop through its self-pipe, is unaffected.
"""

from __future__ import annotations

import asyncio
import math
import selectors
import time
from dataclasses import dataclass

US_PER_S = 1_000_000
MS_PER_S = 1000


@dataclass
class Window:
    """A stretch of time in which the loop polls instead of sleeping (time.monotonic() seconds)."""

    start: float
    end: float

    def cancel(self) -> None:
        """The expected event came (or will not): stop polling for it."""
        self.end = 0.0


@dataclass
class SpinStats:
    """What spinning did (read by tests and the bench)."""

    windows: int = 0  # windows asked for
    caught: int = 0  # selects that found an event while polling
    missed: int = 0  # selects that polled to a window's end and then slept
    spun_s: float = 0.0  # time spent polling


class SpinSelector(selectors.EpollSelector):
    """An epoll selector that polls (timeout 0) inside expected windows and sleeps outside them.

    Args:
        max_spin_s: the longest any window may poll (longer windows are cut to it); 0 = never poll.
    """

    def __init__(self, max_spin_s: float) -> None:
        super().__init__()
        self.max_spin_s = max_spin_s
        self.windows: list[Window] = []
        self.stats = SpinStats()

    def expect(self, start: float, end: float) -> Window:
        """Poll from `start` to `end` (at most max_spin_s of it); returns the window (cancel() ends it)."""
        window = Window(start, min(end, start + self.max_spin_s))
        if self.max_spin_s > 0 and window.end > window.start:
            self.windows.append(window)
            self.stats.windows += 1
        return window

    def _next_window(self, now: float) -> Window | None:
        """The earliest window that has not ended (ended ones are dropped)."""
        self.windows = [w for w in self.windows if w.end > now]
        return min(self.windows, key=lambda w: w.start, default=None)

    def select(self, timeout: float | None = None) -> list:
        now = time.monotonic()
        window = self._next_window(now) if self.windows else None
        if window is None or timeout == 0:
            return super().select(timeout)
        deadline = None if timeout is None else now + timeout
        if window.start > now:
            if deadline is not None and deadline <= window.start:
                return super().select(timeout)
            ready = super().select(sleep_before(window.start - now))
            if ready:
                return ready
            now = time.monotonic()
        return self._poll(now, window.end if deadline is None else min(window.end, deadline), deadline)

    def _poll(self, now: float, until: float, deadline: float | None) -> list:
        """Poll until an event or `until`, then sleep to `deadline` (None: until an event)."""
        began = now
        while now < until:
            ready = super().select(0)
            if ready:
                self.stats.caught += 1
                self.stats.spun_s += time.monotonic() - began
                return ready
            now = time.monotonic()
        self.stats.missed += 1
        self.stats.spun_s += now - began
        return super().select(None if deadline is None else max(0.0, deadline - now))


def sleep_before(gap_s: float) -> float:
    """How long to sleep toward a window that starts in `gap_s` seconds: whole milliseconds, rounded down.
    epoll_wait counts its timeout in milliseconds and Python rounds a float timeout UP, so sleeping the
    gap itself would wake up to 1 ms after the window's start; the loop polls the rest instead."""
    return math.floor(gap_s * MS_PER_S) / MS_PER_S


SPIN_AUTO_US = 2000  # what "auto" polls for at most, per window


def auto_spin_us(configured: int, role: str, torch_threads: int = 0, cores: float = 0.0) -> int:
    """SPECDEC_SPIN_US as it applies: `configured` when >= 0; auto (-1): the orchestrator polls, a model
    service only while its torch threads leave a core free (`torch_threads` < `cores`, the CPUs it may use:
    cpu_info.cpu_budget_cores, a container's CPU limit included): with every core
    in the forward, a polling event loop takes a core from the model thread's accept rule and from the
    OpenMP team (measured at 2 threads on 2 cores: overhead 1.46 -> 3.35 ms a round)."""
    if configured >= 0:
        return configured
    if role == "orchestrator" or leaves_a_core(torch_threads, cores):
        return SPIN_AUTO_US
    return 0


def leaves_a_core(torch_threads: int, cores: float) -> bool:
    """Whether a model service's torch threads leave a CPU of its budget free (`cores`: cpu_budget_cores): the
    auto rule of polling."""
    return torch_threads < cores


_selector: SpinSelector | None = None  # the selector of this process's event loop, once made by new_loop


def new_loop() -> asyncio.AbstractEventLoop:
    """A new event loop whose selector polls in expected windows, once configure() has set a bound."""
    global _selector
    _selector = SpinSelector(0.0)
    return asyncio.SelectorEventLoop(_selector)


def configure(spin_us: int) -> None:
    """Poll for at most `spin_us` µs per window from now on (0: never)."""
    if _selector is not None:
        _selector.max_spin_s = max(0, spin_us) / US_PER_S


def expect(start: float, end: float) -> Window | None:
    """Ask the loop to poll from `start` to `end` (monotonic); None where this process's loop does not spin."""
    if _selector is None or _selector.max_spin_s <= 0:
        return None
    return _selector.expect(start, end)


def expect_soon(within_s: float) -> Window | None:
    """Poll from now for up to `within_s` seconds (an event is due at once: the next request of a round)."""
    now = time.monotonic()
    return expect(now, now + within_s)


def stats() -> SpinStats | None:
    """What this process's loop spun (None when it was not made by new_loop)."""
    return None if _selector is None else _selector.stats

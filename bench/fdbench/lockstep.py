"""Media pace with several sessions at once: one clock of micro-turns that all of them share.

In real time, two sessions that run at once share the one background reasoner as the wall clock
interleaves them: a question asked while the other session's answer is being generated waits for it.
In media pace each session steps as fast as the server allows, so without a common clock one session
could be many micro-turns ahead of the other, and which request waits behind which would depend on
step speed, not on when the questions were asked. This keeps them in lockstep:

- each concurrency slot has a position on the shared clock: the micro-turns it has had answered;
- a slot sends shared micro-turn `k` only once every other live slot has had micro-turn `k - 1`
  answered, so no session is ever more than one micro-turn ahead of another;
- a new sample joins at its slot's position, and tells the server where its micro-turn 0 lies
  (`session.duplex.media_clock`), so the server times its reasoner's requests on the shared clock;
- a slot between samples holds its position (the others wait for it); a slot with no samples left
  retires and is waited for no more.

After each clip the client streams silence for as long as real time holds the session open
(`client.media_grace_ticks`), so the next sample of a slot starts where it would start in real time,
give or take a fraction of a micro-turn.
"""

from __future__ import annotations

import asyncio


class Lockstep:
    """The shared clock of `slots` concurrency slots (see the module docstring)."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"a lockstep needs at least one slot, got {slots}")
        self._pos = [0] * slots  # shared micro-turns answered, per slot
        self._live = [True] * slots
        self._moved = asyncio.Condition()

    def position(self, slot: int) -> int:
        return self._pos[slot]

    async def answered(self, slot: int, position: int) -> None:
        """Slot `slot` has had every shared micro-turn before `position` answered."""
        if position > self._pos[slot]:
            self._pos[slot] = position
            async with self._moved:
                self._moved.notify_all()

    async def retire(self, slot: int) -> None:
        """No more samples for `slot`: the others stop waiting for it."""
        self._live[slot] = False
        async with self._moved:
            self._moved.notify_all()

    def may_send(self, slot: int, tick: int) -> bool:
        return all(pos >= tick for i, pos in enumerate(self._pos) if i != slot and self._live[i])

    async def turn(self, slot: int, tick: int) -> None:
        """Wait until slot `slot` may send shared micro-turn `tick`."""
        async with self._moved:
            await self._moved.wait_for(lambda: self.may_send(slot, tick))


class Slot:
    """One sample's view of its slot: its micro-turn `i` is shared micro-turn `join + i`."""

    def __init__(self, lock: Lockstep, slot: int) -> None:
        self.lock, self.slot = lock, slot
        self.join = lock.position(slot)

    async def turn(self, i: int) -> None:
        await self.lock.turn(self.slot, self.join + i)

    async def answered(self, count: int) -> None:
        await self.lock.answered(self.slot, self.join + count)

"""Small argument helpers shared by the front objects."""

import asyncio


def awaitable(coro):
    """The `_async` half of a pair: a Task when a loop runs (so creating it is enough to start
    it), else the coroutine itself."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return coro
    return loop.create_task(coro)

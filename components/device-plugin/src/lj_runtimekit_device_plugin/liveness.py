"""Whether a Runtime socket that takes no connection is a restart to wait for or a Runtime that
is down. Pure: a clock in, a decision out.

The calls a kubelet waits on (Allocate, and the ListAllocations/Release/UpdateAllocationOwner it
makes; NodePrepareResources in mode dra) would wait out the whole ``rpc_timeout`` on a missing
socket, and the kubelet retries into the same wait. Failing at once is right for a Runtime that
is down, wrong for one that is restarting: the kubelet turns a failed Allocate into a pod that
failed for good, so a restart would reject every pod admitted during it. The rule:

- the socket takes a connection: the call goes ahead with its deadline (a Runtime that is there
  but slow keeps it all);
- it does not (missing, or a file nobody listens on) and the Runtime was **seen alive within
  ``restart_grace``** (an answer to any call, a WatchDevices stream open until then, a connection
  its socket took): a restart. The call waits for the socket to take connections again, within
  its deadline, and then goes ahead;
- it does not, and the Runtime was last seen longer than ``restart_grace`` ago, or never since
  this process started: it is down, and the call fails at once, naming the socket.

So a restart shorter than ``restart_grace`` + ``rpc_timeout`` rejects no pod, and a Runtime that
has been down longer fails each Allocate within milliseconds with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: Default of the setting ``runtime_restart_grace``: the guide's longest reconnect backoff, so a
#: Runtime the plugin's own loops have not found again yet still counts as restarting.
RESTART_GRACE_S = 30.0


class Liveness:
    """When the Runtime was last seen alive, by one client."""

    def __init__(
        self, restart_grace_s: float = RESTART_GRACE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.restart_grace_s = restart_grace_s
        self.clock = clock
        self._seen: float | None = None
        self._streams = 0

    def saw(self) -> None:
        """The Runtime answered, or its socket took a connection, just now."""
        self._seen = self.clock()

    def stream_opened(self) -> None:
        """A stream delivered its first message: the Runtime is alive while it lasts."""
        self._streams += 1
        self.saw()

    def stream_closed(self) -> None:
        """A stream that was open ended: the Runtime was alive until now."""
        self._streams = max(self._streams - 1, 0)
        self.saw()

    def since_seen(self) -> float | None:
        """Seconds since the Runtime was last seen alive; None: never, since this started."""
        if self._streams:
            return 0.0
        if self._seen is None:
            return None
        return max(self.clock() - self._seen, 0.0)

    def restarting(self) -> bool:
        """Whether a socket that takes no connection now is waited for (see the module)."""
        since = self.since_seen()
        return self.restart_grace_s > 0 and since is not None and since <= self.restart_grace_s

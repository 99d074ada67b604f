"""The server's counters: requests by route and status, tokens, streams, disconnects and deadlines."""

from __future__ import annotations

import collections
import dataclasses


@dataclasses.dataclass
class ServeMetrics:
    """Counters since start (a snapshot is ``as_dict``); updated on the server's event loop only."""

    requests: collections.Counter = dataclasses.field(default_factory=collections.Counter)   # by route
    responses: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # by HTTP status
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    in_flight: int = 0
    streams: int = 0
    disconnects: int = 0        # streams whose client went away before the end (their turns are cancelled)
    deadline_exceeded: int = 0

    def as_dict(self) -> dict:
        """Returns the counters as a JSON-ready dict."""
        return {"requests": dict(self.requests), "responses": {str(k): v for k, v in self.responses.items()},
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "cached_prompt_tokens": self.cached_prompt_tokens, "in_flight": self.in_flight,
                "streams": self.streams, "disconnects": self.disconnects,
                "deadline_exceeded": self.deadline_exceeded}

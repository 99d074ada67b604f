"""OpenAI-style errors: every refused request gets a 4xx (or 5xx) with ``{"error": {message, type, param, code}}``,
the body the ``openai`` client turns into ``BadRequestError``, ``NotFoundError`` and the like."""

from __future__ import annotations

from starlette.responses import JSONResponse

ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
               408: "timeout_error", 413: "invalid_request_error", 503: "server_error", 504: "timeout_error"}


class APIError(Exception):
    """A request the server refuses or could not finish: its HTTP status, message, offending field and code."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        """Returns the JSON error body."""
        return {"error": {"message": self.message, "type": ERROR_TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        """Returns the error as a JSON response."""
        return JSONResponse(self.body(), status_code=self.status)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """Returns a 400 invalid_request_error."""
    return APIError(400, message, param=param, code=code)

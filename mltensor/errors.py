"""WebNN's DOMException names as Python exceptions (API.md, "Errors").

TypeError stays the builtin TypeError; everything else subclasses DOMException.
"""


class DOMException(Exception):
    """Base of the WebNN errors that are not TypeError."""


class InvalidStateError(DOMException):
    pass


class NotSupportedError(DOMException):
    pass


class OperationError(DOMException):
    pass


class UnknownError(DOMException):
    pass


class DataError(DOMException):
    pass

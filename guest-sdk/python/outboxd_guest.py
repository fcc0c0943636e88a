"""outboxd helpers for consumer plugins in Python (componentize-py).

A failed statement raises `componentize_py_types.Err` whose `value` is a
`DbError_Refused`, `DbError_BudgetExceeded` or `DbError_Database` (SQLSTATE,
message): catch it like any exception. `@handler` turns whatever escapes
`handle` into the `plugin-error` the host expects, with the mapping of the
Rust SDK: refused -> permanent, budget and database -> retryable, any other
exception -> retryable with its type and text. Without it an escaping
`DbError` traps the component (componentize-py cannot lower it as a
`plugin-error`: `KeyError(<class '...DbError_Database'>)`).
"""

import functools

from componentize_py_types import Err
from wit_world.imports import transaction as _tx

try:
    # The consumer-http world names outbox:plugin/types this way (wasi:http
    # has a `types` interface too).
    from wit_world.imports import outbox_plugin_types as _types
except ImportError:
    from wit_world.imports import types as _types


def permanent(message):
    """An error for `raise`: no later attempt can succeed."""
    return Err(_types.PluginError_Permanent(message))


def retryable(message):
    """An error for `raise`: try again later, with backoff."""
    return Err(_types.PluginError_Retryable(message))


def sqlstate(error):
    """The SQLSTATE of a caught database error, or None."""
    value = getattr(error, "value", None)
    if isinstance(value, _tx.DbError_Database):
        return value.value[0]
    return None


def describe(value):
    """The text the host and the Rust SDK use for a DbError."""
    if isinstance(value, _tx.DbError_Refused):
        return f"statement refused: {value.value}"
    if isinstance(value, _tx.DbError_BudgetExceeded):
        return f"budget exceeded: {value.value}"
    code, message = value.value
    return f"database error {code}: {message}" if code else f"database error: {message}"


def plugin_error(exc):
    """The `plugin-error` for an exception that escaped `handle`."""
    value = getattr(exc, "value", None) if isinstance(exc, Err) else None
    if isinstance(value, (_types.PluginError_Permanent, _types.PluginError_Retryable)):
        return exc
    if isinstance(value, _tx.DbError_Refused):
        return permanent(describe(value))
    if isinstance(value, (_tx.DbError_BudgetExceeded, _tx.DbError_Database)):
        return retryable(describe(value))
    return retryable(f"{type(exc).__name__}: {exc}")


def handler(handle):
    """Decorates `WitWorld.handle` so no exception escapes it unconverted."""

    @functools.wraps(handle)
    def wrapped(self, tx, message):
        try:
            return handle(self, tx, message)
        except Exception as exc:  # noqa: BLE001 - every escape is converted
            raise plugin_error(exc) from None

    return wrapped

"""A consumer in Python, built with componentize-py: one `ledger_entries` row
per order and a `ledger.recorded` event, in the message's transaction.

An order already in the ledger (a unique violation, SQLSTATE 23505 on
Postgres, extended code 2067 on SQLite) is refused permanently: the
database error is caught like any exception. Any other error escapes and
`outboxd_guest.handler` makes it a retryable plugin error.
"""

import json

import outboxd_guest
import wit_world
from componentize_py_types import Err
from wit_world.imports import transaction

UNIQUE_VIOLATION = ("23505", "2067", "1555")


class WitWorld(wit_world.WitWorld):
    @outboxd_guest.handler
    def handle(self, tx, message):
        order = json.loads(bytes(message.payload))
        order_id, amount = str(order["order_id"]), int(order["amount_cents"])
        try:
            tx.execute(
                "INSERT INTO ledger_entries (order_id, amount_cents, message_id) VALUES ($1, $2, $3)",
                [transaction.Value_Text(order_id), transaction.Value_Int(amount), transaction.Value_Text(message.id)],
            )
        except Err as e:
            if outboxd_guest.sqlstate(e) in UNIQUE_VIOLATION:
                raise outboxd_guest.permanent(f"order {order_id} is already in the ledger") from None
            raise
        payload = {"order_id": order_id, "amount_cents": amount, "message_id": message.id}
        tx.emit(transaction.NewEvent(order_id, "ledger.recorded", json.dumps(payload).encode(), []))

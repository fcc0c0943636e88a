"""{{name}}: a consumer. Records each order in `orders_seen`, in the
transaction that also marks the message handled. A failed statement
raises `componentize_py_types.Err` (catch it to decide; see
outboxd_guest.py); one that escapes is a retryable error."""

import json

import outboxd_guest
import wit_world
from wit_world.imports.transaction import Value_Int, Value_Text


class WitWorld(wit_world.WitWorld):
    @outboxd_guest.handler
    def handle(self, tx, message):
        order = json.loads(bytes(message.payload))
        tx.execute(
            "INSERT INTO orders_seen (message_id, order_id, amount_cents) VALUES ($1, $2, $3)",
            [Value_Text(message.id), Value_Text(order["order_id"]), Value_Int(order["amount_cents"])],
        )

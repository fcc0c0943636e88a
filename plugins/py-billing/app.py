"""The billing consumer in Python (componentize-py): one invoice per
`order.confirmed`, the same effect as plugins/billing (Rust), so
`outboxd bench consumer` can compare the languages on equal work."""

import json
import time

import wit_world
from wit_world.imports import transaction, types
from componentize_py_types import Err


class WitWorld(wit_world.WitWorld):
    def handle(self, tx: transaction.Transaction, message: types.Message) -> None:
        doc = json.loads(bytes(message.payload))
        order = doc.get("data", doc) if "specversion" in doc else doc
        try:
            tx.execute(
                "INSERT INTO invoices (order_id, customer_id, amount_cents, message_id, issued_at)"
                " VALUES ($1, $2, $3, $4, $5)",
                [
                    transaction.Value_Text(order["order_id"]),
                    transaction.Value_Text(order["customer_id"]),
                    transaction.Value_Int(int(order["total_cents"])),
                    transaction.Value_Text(message.id),
                    transaction.Value_Int(time.time_ns() // 1000),
                ],
            )
        except KeyError as e:
            raise Err(types.PluginError_Permanent(f"order field missing: {e}"))

// A consumer in JavaScript (world consumer), the twin of plugins/py-ledger:
// one ledger_entries row per order and a ledger.recorded event, in the
// message's transaction. An order already in the ledger (a unique
// violation) is refused permanently: the db-error is caught like any
// error. Any other error escapes, and `handler` makes it a retryable
// plugin error instead of an invalid one.
import { handler, json, permanent, sql, sqlstate } from "./outboxd_guest.js";

const UNIQUE_VIOLATION = ["23505", "2067", "1555"];

export const handle = handler((tx, message) => {
  const order = json(message);
  const orderId = String(order.order_id);
  try {
    tx.execute("INSERT INTO ledger_entries (order_id, amount_cents, message_id) VALUES ($1, $2, $3)",
      [sql.text(orderId), sql.int(order.amount_cents), sql.text(message.id)]);
  } catch (e) {
    if (UNIQUE_VIOLATION.includes(sqlstate(e))) throw permanent(`order ${orderId} is already in the ledger`);
    throw e;
  }
  const payload = { order_id: orderId, amount_cents: order.amount_cents, message_id: message.id };
  tx.emit({ aggregateId: orderId, eventType: "ledger.recorded", payload: new TextEncoder().encode(JSON.stringify(payload)), headers: [] });
});

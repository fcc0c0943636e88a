// {{name}}: a consumer. Records each order in orders_seen, in the
// transaction that also marks the message handled. A failed statement
// throws an error whose .payload is the db-error (catch it to decide; see
// outboxd_guest.js); one that escapes is a retryable error.
import { handler, json, sql } from "./outboxd_guest.js";

export const handle = handler((tx, message) => {
  const order = json(message);
  tx.execute("INSERT INTO orders_seen (message_id, order_id, amount_cents) VALUES ($1, $2, $3)", [
    sql.text(message.id),
    sql.text(order.order_id),
    sql.int(order.amount_cents),
  ]);
});

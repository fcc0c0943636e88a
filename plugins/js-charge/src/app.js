// A consumer in JavaScript (world consumer-http): charges an order through
// an HTTP payment provider and records the payment, like plugins/charge.
//
// Message: {"order_id": "...", "amount_cents": 1250}. Config: provider_url;
// the plugin POSTs the order to {provider_url}/charges (the host adds
// Idempotency-Key: <message id>). A 2xx answer {"charge_id": "..."} writes
// payments (order_id, charge_id, message_id); a 4xx is permanent, a 5xx or
// a transport error retryable. A payment already recorded for the order (a
// unique violation) is refused permanently: the db-error is caught.
import { get } from "outbox:plugin/config@0.1.0";
import { handler, json, permanent, retryable, sql, sqlstate } from "./outboxd_guest.js";
import { post } from "./outboxd_http.js";

const UNIQUE_VIOLATION = ["23505", "2067", "1555"];

export const handle = handler((tx, message) => {
  const order = json(message);
  const provider = get("provider_url");
  if (!provider) throw permanent("config `provider_url` is not set");
  const res = post(`${provider.replace(/\/$/, "")}/charges`, { json: order });
  if (res.status >= 400 && res.status < 500) throw permanent(`provider refused order ${order.order_id}: ${res.status} ${res.text()}`);
  if (res.status >= 300) throw retryable(`provider answered ${res.status} for order ${order.order_id}`);
  const { charge_id } = res.json();
  try {
    tx.execute("INSERT INTO payments (order_id, charge_id, message_id) VALUES ($1, $2, $3)",
      [sql.text(order.order_id), sql.text(charge_id), sql.text(message.id)]);
  } catch (e) {
    if (UNIQUE_VIOLATION.includes(sqlstate(e))) throw permanent(`order ${order.order_id} is already paid`);
    throw e;
  }
});

// The billing consumer in JavaScript (componentize-js): one invoice per
// `order.confirmed`, the same effect as plugins/billing (Rust), so
// `outboxd bench consumer` can compare the languages on equal work.
export function handle(tx, message) {
  const doc = JSON.parse(new TextDecoder().decode(message.payload));
  const order = doc.specversion ? doc.data : doc;
  if (!order || order.order_id === undefined) {
    throw { tag: "permanent", val: `message ${message.id}: no order in the payload` };
  }
  tx.execute(
    "INSERT INTO invoices (order_id, customer_id, amount_cents, message_id, issued_at) VALUES ($1, $2, $3, $4, $5)",
    [
      { tag: "text", val: String(order.order_id) },
      { tag: "text", val: String(order.customer_id) },
      { tag: "int", val: BigInt(order.total_cents) },
      { tag: "text", val: message.id },
      { tag: "int", val: BigInt(Date.now()) * 1000n },
    ],
  );
}

// A transformer in JavaScript: adds "tagged_by": "javascript" to a JSON
// object payload, or refuses the event permanently on "reject": true.
export function transform(event) {
  const doc = JSON.parse(new TextDecoder().decode(event.payload));
  if (doc.reject) {
    throw { tag: "permanent", val: `event ${event.id}: rejected by the javascript plugin` };
  }
  doc.tagged_by = "javascript";
  return [{
    topic: undefined,
    key: event.key,
    payload: new TextEncoder().encode(JSON.stringify(doc)),
    headers: event.headers,
  }];
}

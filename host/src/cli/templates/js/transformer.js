// {{name}}: a transformer. Adds "tagged_by": "{{name}}" to a JSON object
// payload; refuses a payload that is not an object, permanently.
export function transform(event) {
  const doc = JSON.parse(new TextDecoder().decode(event.payload));
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) {
    throw { tag: "permanent", val: `event ${event.id}: the payload is not a JSON object` };
  }
  doc.tagged_by = "{{name}}";
  const payload = new TextEncoder().encode(JSON.stringify(doc));
  return [{ topic: undefined, key: event.key, payload, headers: event.headers }];
}

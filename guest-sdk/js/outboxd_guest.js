// outboxd helpers for consumer plugins in JavaScript (componentize-js).
//
// A failed statement throws an Error whose `payload` is the WIT db-error:
// { tag: "refused" | "budget-exceeded", val: text } or
// { tag: "database", val: [sqlstate | undefined, text] }. Catch it like any
// error. `handler` turns whatever escapes `handle` into the plugin-error the
// host expects, with the Rust SDK's mapping: refused -> permanent, budget
// and database -> retryable, any other error -> retryable with its text.
// Without it an escaping db-error reaches the host as an invalid
// plugin-error.

const DB_TAGS = new Set(["refused", "budget-exceeded", "database"]);
const PLUGIN_TAGS = new Set(["permanent", "retryable"]);

/** A plugin error to `throw`: no later attempt can succeed. */
export const permanent = (message) => ({ tag: "permanent", val: String(message) });
/** A plugin error to `throw`: try again later, with backoff. */
export const retryable = (message) => ({ tag: "retryable", val: String(message) });

/** The db-error a caught error carries, or null. */
export function dbError(error) {
  const p = error?.payload;
  return p && DB_TAGS.has(p.tag) ? p : null;
}

/** The SQLSTATE of a caught database error, or null. */
export function sqlstate(error) {
  const p = dbError(error);
  return p?.tag === "database" ? (p.val[0] ?? null) : null;
}

/** The text the host and the Rust SDK use for a db-error. */
export function describe(p) {
  if (p.tag === "refused") return `statement refused: ${p.val}`;
  if (p.tag === "budget-exceeded") return `budget exceeded: ${p.val}`;
  const [code, message] = p.val;
  return code ? `database error ${code}: ${message}` : `database error: ${message}`;
}

/** The plugin-error for anything that escaped `handle`. */
export function pluginError(error) {
  if (error && PLUGIN_TAGS.has(error.tag)) return error;
  if (error?.payload && PLUGIN_TAGS.has(error.payload.tag)) return error.payload;
  const p = dbError(error);
  if (p) return p.tag === "refused" ? permanent(describe(p)) : retryable(describe(p));
  return retryable(error instanceof Error ? `${error.name}: ${error.message}` : String(error));
}

/** Wraps a `handle(tx, message)` so no error escapes it unconverted. */
export function handler(handle) {
  return (tx, message) => {
    try {
      return handle(tx, message);
    } catch (error) {
      throw pluginError(error);
    }
  };
}

/** The message payload as JSON. */
export const json = (message) => JSON.parse(new TextDecoder().decode(message.payload));

/** Typed SQL values for `tx.execute`/`tx.query` parameters. */
export const sql = {
  text: (v) => ({ tag: "text", val: String(v) }),
  int: (v) => ({ tag: "int", val: BigInt(v) }),
  float: (v) => ({ tag: "float", val: Number(v) }),
  bool: (v) => ({ tag: "boolean", val: Boolean(v) }),
  json: (v) => ({ tag: "json", val: JSON.stringify(v) }),
  null: () => ({ tag: "null" }),
};

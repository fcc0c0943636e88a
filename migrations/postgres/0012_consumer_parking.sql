-- 0012: consumer dead letters an operator can act on, and per-key parking.
--
-- A message a consumer gives up on parks its key for that consumer
-- (`consumers[].on_dead = "park_key"`, the default): later messages of the
-- same key are recorded here too, as `parked`, in order, and are not
-- handled until the dead letter ahead of them is redriven or discarded.
-- A key is parked while any unresolved row that holds it exists:
--   state 'dead'    waits for an operator;
--   state 'parked'  a later message of the key, waiting behind a dead one;
--   state 'redrive' released by an operator: the running consumer applies
--                   it through its inbox, in id order per key.
-- A row is resolved ('applied', 'duplicate' or 'discarded') in the same
-- transaction as the effect of its message, or by the discard itself.
-- Dead letters written before this migration (`on_dead = "skip"`
-- behaviour: their key moved on) hold no key.
ALTER TABLE consumer_dead_letters
  ADD COLUMN state text NOT NULL DEFAULT 'dead'
    CONSTRAINT consumer_dead_letters_state CHECK (state IN ('dead', 'parked', 'redrive')),
  ADD COLUMN holds_key boolean NOT NULL DEFAULT true,
  ADD COLUMN resolved_at timestamptz,
  ADD COLUMN resolution text
    CONSTRAINT consumer_dead_letters_resolution CHECK (resolution IN ('applied', 'duplicate', 'discarded')),
  ADD COLUMN resolve_reason text,
  -- Fix-forward: NAME@VERSION that a redrive runs the message through.
  ADD COLUMN redrive_with text;
UPDATE consumer_dead_letters SET holds_key = false;
CREATE INDEX consumer_dead_letters_unresolved
  ON consumer_dead_letters (consumer, message_key, id) WHERE resolved_at IS NULL;

-- 0005: what the transformer plugins did to an event.
--
-- outcome is 'published' or 'filtered' once the row is done (published_at
-- set); a filtered event was dropped by a plugin on purpose, not lost.
-- transformed_by lists the plugins that ran, as name@version,...
ALTER TABLE outbox ADD COLUMN outcome text
  CHECK (outcome IS NULL OR outcome IN ('published', 'filtered'));
ALTER TABLE outbox ADD COLUMN transformed_by text;

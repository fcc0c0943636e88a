-- The plugin's table, created by `outboxd plugin test --setup setup.sql`
-- in a transaction that is rolled back. In production it is your
-- application's table, granted to the consumer by consumers[].tables.write.
CREATE TABLE orders_seen (message_id TEXT NOT NULL, order_id TEXT NOT NULL, amount_cents BIGINT NOT NULL)

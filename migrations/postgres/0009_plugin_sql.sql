-- Consumer plugins' SQL (issue 18): the server checks the size of every
-- row a plugin statement returns before sending it, so the host never
-- buffers a value larger than consumers[].max_result_bytes (the driver
-- reads a whole row at once, and one value may be 1 GB). The host wraps
-- each row-returning plugin statement as
--
--   WITH outboxd_rows AS (<statement>) SELECT outboxd_rows.* FROM outboxd_rows
--   WHERE outboxd_row_fits(octet_length(outboxd_rows::text), <cap>)
--
-- The function runs as the plugin's role, so it stays executable by
-- PUBLIC; it reads nothing and only raises.
CREATE OR REPLACE FUNCTION outboxd_row_fits(row_bytes bigint, cap bigint)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
  IF row_bytes > cap THEN
    RAISE EXCEPTION 'a result row of % bytes is larger than consumers[].max_result_bytes (% bytes)', row_bytes, cap
      USING ERRCODE = '54000', HINT = 'select fewer or smaller columns, or raise max_result_bytes';
  END IF;
  RETURN true;
END $$;
